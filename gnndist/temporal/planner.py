"""The batches a rank runs, planned ahead: its events of each global batch (evened out over the
ranks with `--share even`), their negatives, the rows it embeds and their sampled neighbours,
the node state's routes, and, where owners embed the negatives, where each is embedded.

Global batch i is the events [iB, (i+1)B) in time order. What depends on the events only is
exchanged for a window of batches at once, ahead of them (`Planner.steps`): the neighbours (one
exchange per hop), the state rows' counts and routes (`plan` of the node state) and the routes
of negatives embedded by their owners. With several ranks a thread plans the coming windows
while the steps run, on the samplers' group, at the lowest priority (`PrefetchLoader`'s `idle`):
it runs while the step waits for the other ranks, and the step waits for it (timed as `sample`,
or as `sync` without neighbours to sample) only where it is not done in time.
"""
from __future__ import annotations

from contextlib import nullcontext
from functools import partial
from typing import Callable, Iterator, Optional

import numpy as np

from gnndist.runtime import dist
from gnndist.runtime.device import to_device
from gnndist.samplers import PrefetchLoader, sampler_group
from gnndist.samplers.distributed import StepRequests
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.events import BatchEvents, RankEvents, even_out
from gnndist.temporal.models import Batch, TemporalGNN, query_rows, state_rows
from gnndist.temporal.neighbours import Neighbours
from gnndist.temporal.remote_negatives import embedded_rows, route_negatives
from gnndist.temporal.timers import Timers

# negatives(rows, src, dst) -> [B, n] original ids, for the events of one global batch (positions in
# the batch and endpoints, all in original ids)
Negatives = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


class Planner:
    """Makes a rank's batches (see the module docstring). `partitioned`: partitioned node state,
    whose reads are planned too; `owners_embed`: whether a batch's negatives are embedded by
    their owners (asked when a window is planned)."""

    def __init__(self, events: RankEvents, model: TemporalGNN, cfg: LinkConfig, neighbours: Neighbours, state,
                 timers: Timers, partitioned: bool, owners_embed: Callable[[], bool]) -> None:
        self.events, self.model, self.cfg, self.neighbours = events, model, cfg, neighbours
        self.state, self.timers, self.owners_embed = state, timers, owners_embed
        self.partitioned_reads = partitioned  # the node state's reads are planned too

    def batches(self, start: int, stop: int, first: int = 0) -> Iterator[tuple[int, int, int]]:
        """(index, first, last + 1) of the global batches over the events [start, stop), from
        batch `first` on."""
        b = self.cfg.batch_size
        for index in range(first, -(-(stop - start) // b)):
            s = start + index * b
            yield index, s, min(s + b, stop)

    def events_of(self, start: int, stop: int, negatives: Optional[Negatives] = None) -> BatchEvents:
        """This rank's events of the global batch [start, stop) as host arrays, with their
        negatives (none where `negatives` is None)."""
        ev = self.events
        pos = ev.scored_in(start, stop)
        if negatives is None:
            neg = np.zeros((pos.size, 0), np.int64)
        else:
            neg = ev.orig_to_new[negatives(ev.eid[pos] - start, ev.new_to_orig[ev.src[pos]], ev.new_to_orig[ev.dst[pos]])]
        feat = ev.edge_feat[pos] if ev.edge_feat is not None else np.zeros((pos.size, 0), np.float32)
        return BatchEvents(ev.src[pos], ev.dst[pos], ev.t[pos], neg, ev.eid[pos], feat)

    def batch(self, start: int, stop: int, negatives: Optional[Negatives] = None) -> Batch:
        """This rank's batch [start, stop), its neighbours sampled now (a collective)."""
        return self.ready(self.events_of(start, stop, negatives))

    def ready(self, events: BatchEvents) -> Batch:
        """A batch of `events` (a rank's, of one global batch) on the device, its rows, negatives'
        routes and neighbours made now (a collective; the node state's rows are read unplanned)."""
        return self._on_device(*self._plan([events], window=False)[0][0])

    def steps(self, start: int, stop: int, negatives: Optional[Callable[..., np.ndarray]] = None,
              per_event: int = 0, first: int = 0) -> Iterator[tuple[int, Batch]]:
        """(size, this rank's batch) of each global batch over the events [start, stop), in order,
        from batch `first` on (a resumed epoch); `negatives(index, size, rows, src, dst)` gives the
        `per_event` negatives of each event of batch `index`. Planned a window at a time (see the
        module docstring; what a batch holds does not depend on the window it is planned in)."""
        todo = list(self.batches(start, stop, first))
        ks = [self.model.k] * self.model.sampling.hops
        # sized for a full batch's queries (every rank sizes it alike): 3 per event in training,
        # 2 + n in an evaluation with n negatives
        per_window = self.neighbours.steps_ahead(self.cfg.batch_size * (2 + per_event), ks)
        threaded = dist.world_size() > 1  # one process plans inline

        def plan(chunk: list[tuple[int, int, int]]) -> tuple:
            with self.timers.untimed() if threaded else nullcontext():
                events = [self.events_of(s, e, None if negatives is None else partial(negatives, index, e - s))
                          for index, s, e in chunk]
                return [e - s for _, s, e in chunk], *self._plan(events, window=True)

        windows = iter(PrefetchLoader([todo[w:w + per_window] for w in range(0, len(todo), per_window)], plan,
                                      enabled=threaded, idle=True))
        try:
            while True:
                with self.timers.phase("sample" if ks else "sync") if threaded else nullcontext():
                    planned = next(windows, None)  # the wait for the plan
                if planned is None:
                    return
                sizes, items, state_plan = planned
                self._use(state_plan)
                for size, item in zip(sizes, items):
                    yield size, self._on_device(*item)
        finally:
            windows.close()

    def _plan(self, events: list[BatchEvents], window: bool) -> tuple[list[tuple], object]:
        """What the batches of `events` depend on, exchanged for all at once (collectives on the
        samplers' group): per batch (events, rows, planned hops, route of negatives embedded by
        owners); for a `window` of a run's steps, the events are first evened out over the ranks
        (with `--share even`) and the node state's plan of them is made too."""
        if window and self.cfg.share == "even" and dist.world_size() > 1:
            events = even_out(events, self.events.book, sampler_group())
        rows = [query_rows(ev.src, ev.dst, ev.t, ev.neg) for ev in events]
        routes: list[Optional[StepRequests]] = [None] * len(events)
        if self.owners_embed():
            with self.timers.phase("sync"):
                routes = route_negatives([(ev.neg, ev.t) for ev in events], self.events.book, sampler_group())
            rows = [embedded_rows(ev.src, ev.dst, ev.t, r) for ev, r in zip(events, routes)]
        ks = [self.model.k] * self.model.sampling.hops
        hops: list[list[tuple]] = [[] for _ in events]
        if ks:
            hops = self.neighbours.plan([self.model.neighbour_queries(*r, 2 * ev.src.size)[:2]
                                         for r, ev in zip(rows, events)], ks)
        state_plan = None
        if self.state is not None and window:
            reads = ([state_rows(r[0], h[0][0].nbr if h else None)[0] for r, h in zip(rows, hops)]
                     if self.partitioned_reads else None)  # only partitioned reads travel
            state_plan = self.state.plan([np.unique(np.concatenate([ev.src, ev.dst])) for ev in events], reads)
        return list(zip(events, rows, hops, routes)), state_plan

    def _use(self, state_plan: object) -> None:
        """The node state follows `state_plan`'s routes in the coming steps."""
        if self.state is not None:
            self.state.use(state_plan)

    def _on_device(self, events: BatchEvents, rows: tuple, hops: list[tuple], route: Optional[StepRequests]
                   ) -> Batch:
        """A planned batch on the device; the node state learns which events it scores."""
        device = self.neighbours.device
        batch = Batch(*(to_device(a, device) for a in (events.src, events.dst, events.t, events.eid, events.feat,
                                                        events.neg)),
                      host=(events.src, events.dst, events.t, events.neg), rows=rows,
                      hops=self.neighbours.hops(hops), route=route)
        if self.state is not None:
            self.state.begin_batch(events.src, events.dst, events.eid)
        return batch
