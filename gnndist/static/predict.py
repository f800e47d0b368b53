"""Using a trained node-classification model: the class probabilities of every node (or of
given ids) with the selected (best-validation) parameters of a checkpoint, over full
neighbourhoods, through the trainer's own evaluation path (`NodeTrainer.eval_logits`). On one
process, or on the W ranks of a store of W parts, each rank classifying the nodes it owns; the
metrics are the same. Node ids are those of the data's graph (a store's original ids).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional, Union

import numpy as np
import torch

from gnndist.graph import Graph, as_node_ids
from gnndist.runtime.launch import Data, run_job
from gnndist.partition import RankPart
from gnndist.predict import Checkpoint, SavedModel, gather_rows, saved_model, source_of, to_positions
from gnndist.static.trainer import (SPLIT, NodeConfig, NodeTrainer, PartGraph, RankGraph, check_node_graph,
                                    rank_graph)


def node_probabilities(checkpoint: Checkpoint, data: Data, ids: Optional[np.ndarray] = None, nproc: int = 1,
                       device: str = "cpu", quiet: bool = False) -> np.ndarray:
    """Class probabilities [len(ids), C] (softmax of the logits) of the nodes `ids` of `data`
    (default: every node, in id order)."""
    saved = saved_model(checkpoint, "node")
    source = source_of(data)
    saved.check_kind(source)
    ids = None if ids is None else as_node_ids("ids", ids)
    split = replace(SPLIT, check=lambda g: (check_node_graph(g), _check_sizes(saved, g)))  # before raw data is split
    return run_job(source, nproc, split, _probabilities_rank, saved, quiet, ids, device=device, quiet=quiet)


def _check_sizes(saved: SavedModel, data: Union[Graph, RankGraph]) -> None:
    """A one-line error unless `data` has the feature and class counts the model was trained with."""
    saved.check_sizes({"num_features": data.num_features, "num_classes": data.num_classes})


def _probabilities_rank(source: Union[Graph, RankPart], dev: torch.device, saved: SavedModel, quiet: bool,
                        ids: Optional[np.ndarray]) -> np.ndarray:
    cfg = saved.settings(NodeConfig, eval_fanouts=None, device=dev.type, quiet=quiet)  # full neighbourhoods
    view = rank_graph(source, cfg, dev)
    _check_sizes(saved, view)
    trainer = NodeTrainer(view, cfg, dev)
    saved.load_params(trainer.model)
    if isinstance(view, PartGraph):  # the original ids of the nodes it owns (ascending), from its first id
        num_nodes, owned, first = view.part.num_nodes, view.part.orig_ids, view.part.start
    else:
        num_nodes, owned, first = view.graph.num_nodes, np.arange(view.graph.num_nodes), 0
    want = np.arange(num_nodes, dtype=np.int64) if ids is None else np.unique(to_positions(ids, None, num_nodes))
    at = np.minimum(np.searchsorted(owned, want), max(owned.size - 1, 0))
    mine = np.flatnonzero(owned[at] == want) if owned.size else np.zeros(0, np.int64)
    probs = torch.softmax(trainer.eval_logits(first + at[mine]), 1).cpu()
    out = gather_rows(mine, probs, want.size, dev)
    return out if ids is None else out[np.searchsorted(want, ids)]
