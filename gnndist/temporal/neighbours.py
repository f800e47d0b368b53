"""Temporal neighbourhoods of a rank's queries, with the sampled events' features, sampled by the
queried nodes' owners across ranks.

Samples depend on the events only (the T-CSR, the query times, a seed), never on the training,
so a trainer samples the queries of many steps at once (`plan`): one exchange per hop serves
a whole window of steps instead of one per step.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from gnndist.runtime.device import to_device
from gnndist.samplers import DistFeatures, DistTemporalSampler
from gnndist.samplers.temporal import TemporalSample, multihop
from gnndist.temporal.events import RankEvents
from gnndist.temporal.models import Hop
from gnndist.temporal.timers import Timers

PLAN_BYTES = 16 * 2**20  # what a plan's samples may hold (host memory)
PLAN_STEPS = 32  # the most steps one plan samples for


def sample_bytes(queries: int, ks: list[int], edge_dim: int) -> int:
    """The bytes of the samples of `queries` queries with `ks` neighbours per hop: an entry's
    node, event id, time, time gap, mask and event features."""
    return sum(queries * math.prod(ks[:h + 1]) for h in range(len(ks))) * (8 + 8 + 8 + 4 + 1 + 4 * edge_dim)


def steps_ahead(queries: int, ks: list[int], edge_dim: int) -> int:
    """How many steps of at most `queries` queries each one plan covers: as many as fit in
    PLAN_BYTES, from 1 to PLAN_STEPS. Depends on global sizes only, so every rank plans the
    same steps."""
    return max(1, min(PLAN_STEPS, PLAN_BYTES // max(sample_bytes(queries, ks, edge_dim), 1)))


class Neighbours:
    """Temporal neighbourhoods of queries: sampled by the queried nodes' owners, with the features
    of the sampled events (a collective: one exchange per hop for the samples). Without an edge
    cache the owner that sampled an event sends its features with the sample; with one they are
    fetched afterwards through `DistFeatures`, behind the cache (one exchange more)."""

    def __init__(self, events: RankEvents, strategy: str, seed: int, timers: Timers, device: torch.device,
                 progress: bool = False, cache: str = "none") -> None:
        self.events, self.strategy, self.seed, self.timers, self.device = events, strategy, seed, timers, device
        self.sampler = DistTemporalSampler(*events.tcsr(progress), events.book, streams=events.orig_ids)
        rows = events.edge_feat if events.edge_feat is not None else np.zeros((events.num_held, 0), np.float32)
        self.features = DistFeatures.for_events(rows, events.eid, events.num_events)
        self.carry = cache == "none" and events.edge_dim > 0  # features come with the samples
        self.remote_queries = self.carried_bytes = 0

    def held_features(self, eid: np.ndarray) -> np.ndarray:
        """Feature rows of events this rank holds, by global id."""
        return self.events.edge_feat[np.searchsorted(self.events.eid, eid)]

    def sample(self, nodes: np.ndarray, times: np.ndarray, ks: list[int]):
        """The samples of every hop, and the rank that sampled each hop's queries."""
        features = self.held_features if self.carry else None
        with self.timers.phase("sample"):
            hops = multihop(lambda n, t, k, h: self.sampler.sample_hop(n, t, k, h, self.strategy, self.seed, features),
                            nodes, times, ks)
        queried = [nodes] + [h.nbr.reshape(-1) for h in hops[:-1]]
        holders = [self.events.book.owner(q) for q in queried]
        self.remote_queries += sum(int((h != self.events.rank).sum()) for h in holders)
        if self.carry:
            row = self.events.edge_feat.dtype.itemsize * self.events.edge_dim
            self.carried_bytes += sum(row * int(h.mask[o != self.events.rank].sum()) for h, o in zip(hops, holders))
        return hops, holders

    def _with_features(self, nodes: np.ndarray, times: np.ndarray, ks: list[int]
                       ) -> list[tuple[TemporalSample, torch.Tensor]]:
        """Every hop's samples and the sampled events' features [R, k, D] (zero where masked)."""
        hops, holders = self.sample(nodes, times, ks)
        d = self.events.edge_dim
        feats = [torch.from_numpy(h.feat) if self.carry else torch.zeros((*h.mask.shape, d)) for h in hops]
        if d and not self.carry:
            with self.timers.phase("fetch"):
                rows = self.features.fetch(np.concatenate([h.eid[h.mask] for h in hops]),
                                           np.concatenate([np.repeat(o, h.mask.sum(1)) for o, h in zip(holders, hops)]))
                at = 0
                for f, h in zip(feats, hops):
                    n = int(h.mask.sum())
                    f[torch.from_numpy(h.mask)] = rows[at:at + n]
                    at += n
        return list(zip(hops, feats))

    def steps_ahead(self, queries: int, ks: list[int]) -> int:
        """How many steps of at most `queries` queries each one plan covers (`steps_ahead`)."""
        return steps_ahead(queries, ks, self.events.edge_dim)

    def plan(self, queries: list[tuple[np.ndarray, np.ndarray]], ks: list[int]) -> list[list[tuple]]:
        """Sample the queries (nodes, times) of several coming steps at once (a collective: one
        exchange per hop for all of them): per step, each hop's (samples, features) on the host
        (`hops` puts them on the device when the step comes)."""
        cuts = np.cumsum([0] + [n.size for n, _ in queries])
        hops = self._with_features(np.concatenate([n for n, _ in queries]), np.concatenate([t for _, t in queries]), ks)
        return [[(s.rows(cuts[i] * math.prod(ks[:h]), cuts[i + 1] * math.prod(ks[:h])),
                  f[cuts[i] * math.prod(ks[:h]):cuts[i + 1] * math.prod(ks[:h])]) for h, (s, f) in enumerate(hops)]
                for i in range(len(queries))]

    def hops(self, planned: list[tuple]) -> list[Hop]:
        """One step's planned samples (`plan`) as `Hop`s on the device."""
        return [Hop(*(to_device(a, self.device) for a in (h.nbr, h.eid, h.ts, h.dt, h.mask)),
                    to_device(f, self.device), h.nbr, h.mask) for h, f in planned]

    def sample_now(self, nodes: np.ndarray, times: np.ndarray, ks: list[int]) -> list[Hop]:
        """The hops of these queries, sampled now (a collective)."""
        return self.hops(self.plan([(nodes, times)], ks)[0]) if ks else []
