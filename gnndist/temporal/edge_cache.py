"""Filling the edge-feature cache of a temporal run (`--cache`; a collective): `degree` with the
remote events of the most active endpoints, offered by the ranks that hold them; `presample`
with the remote events one sampling pass over the training batches requests most; `adaptive`
starts empty."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from gnndist.runtime import dist
from gnndist.samplers.cache import RequestCounts, degree_offers
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.linkpred import train_negatives
from gnndist.temporal.planner import Planner


def fill_edge_cache(cfg: LinkConfig, planner: Planner, train_end: int, among: Optional[np.ndarray] = None) -> None:
    """Put the cache of `cfg.cache` in front of the neighbours' edge features (nothing in one
    process or without edge features); `among`: the training negatives' candidates
    (`linkpred.Candidates.train`)."""
    ev, features = planner.events, planner.neighbours.features
    if cfg.cache == "none" or ev.num_parts == 1 or ev.edge_dim == 0:
        return
    candidates = None
    if cfg.cache == "degree":
        degree = torch.cat(dist.all_gather_varsize(torch.from_numpy(np.diff(ev.tcsr()[0])), features.group)).numpy()
        own = ev.scored
        score = (degree[ev.src[own]] + degree[ev.dst[own]]).astype(np.float64)
        candidates = degree_offers(ev.scored_eid, ev.src[own], ev.dst[own], score, ev.book,
                                   features.capacities(cfg.cache_size), features.group)
    elif cfg.cache == "presample":
        candidates = _presampled(cfg, planner, train_end, features.capacities(cfg.cache_size)[ev.rank], among)
    features.set_cache(cfg.cache, cfg.cache_size, candidates=candidates)


def _presampled(cfg: LinkConfig, planner: Planner, train_end: int, capacity: int, among: Optional[np.ndarray]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The remote events one pass of this rank's training-batch sampling requests, with their
    request counts and holders."""
    ev, model, neighbours = planner.events, planner.model, planner.neighbours
    counts = RequestCounts(capacity)
    if model.sampling.hops == 0:
        return counts.candidates()
    for index, s, e in planner.batches(0, train_end):
        pos = ev.scored_in(s, e)
        nodes, times = [ev.src[pos], ev.dst[pos]], [ev.t[pos], ev.t[pos]]
        if model.sampling.rows == "queries":
            neg = train_negatives(cfg.seed, 1, index, e - s, ev.eid[pos] - s, ev.new_to_orig[ev.dst[pos]],
                                  ev.num_nodes, among)
            nodes.append(ev.orig_to_new[neg[:, 0]])
            times.append(ev.t[pos])
        hops, owner = neighbours.sample(np.concatenate(nodes), np.concatenate(times), [model.k] * model.sampling.hops)
        eid = np.concatenate([h.eid[h.mask] for h in hops])
        held_by = np.concatenate([np.repeat(o, h.mask.sum(1)) for o, h in zip(owner, hops)])
        remote = neighbours.features.book.position(eid) < 0
        counts.add(eid[remote], held_by[remote])
    return counts.candidates()
