"""What one node-classification rank allocates (`node_footprint`), for `gnndist.footprint`'s check."""
from __future__ import annotations

from typing import Any

import torch

from gnndist.footprint import Footprint, Part, model_bytes, sizing
from gnndist.samplers.cache import capacity_rows
from gnndist.static.models import StaticGNN


def node_footprint(graph: Any, cfg: Any, device: torch.device = torch.device("cpu")) -> Footprint:
    """What one node-classification rank allocates for its `RankGraph` and `NodeConfig`."""
    what = f"the {cfg.model} trainer"
    with sizing(what, "--hidden"):
        model = StaticGNN(cfg.model, graph.num_features, cfg.hidden, graph.num_classes,
                          num_layers=len(cfg.fanouts), dropout=cfg.dropout)
    store = getattr(graph, "dist_features", None)  # the remote features of a part (none in one process)
    cache = 0
    if store is not None and cfg.cache != "none":
        cache = capacity_rows(cfg.cache_size, store.num_remote, store.row_bytes) * store.row_bytes
    return Footprint(what, torch.device(device), [
        Part("model with gradients and Adam state", model_bytes(model), "--hidden"),
        Part("feature cache", cache, "--cache-size", on_device=False)])
