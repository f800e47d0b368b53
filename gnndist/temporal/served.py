"""Negatives embedded by their nodes' owners (partitioned memory): a rank sends the queries (node,
time) of its events' negatives to the negatives' owners, which embed them with their own events
(their state rows and most of their neighbours' rows live there) and send the embeddings back;
the trainer has it done in evaluation, where it moves a negative's embedding (4 bytes per
memory dimension) instead of the state rows of the node and its sampled neighbours.

Where a negative goes depends on the events only, so `route` sends the queries of a window of
steps in one exchange, ahead of the steps; a step then exchanges only the embeddings.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from gnndist import dist
from gnndist.graph import owners
from gnndist.samplers.distributed import Requests


@dataclass
class Route:
    """Where one step's negatives are embedded: this rank's negatives (flattened [B * n]) in the
    order they were sent (`order`, by owner) and how many each rank embeds (`sizes`); the queries
    other ranks sent here (`nodes`, `times`, in rank order) and how many each sent
    (`served_sizes`)."""

    order: np.ndarray
    sizes: list[int]
    served_sizes: list[int]
    nodes: np.ndarray
    times: np.ndarray


def route(negatives: Sequence[tuple[np.ndarray, np.ndarray]], node_offsets: np.ndarray, group: Any
          ) -> list[Route]:
    """The routes of the steps whose negatives and event times are `(neg [B, n], t [B])`, in one
    exchange for all (a collective, on the host group `group`)."""
    w = dist.world_size()
    keys, owner = [], []
    for step, (neg, t) in enumerate(negatives):
        flat = neg.reshape(-1)
        keys.append(np.stack([flat, np.repeat(t, neg.shape[1]).view(np.int64), np.full(flat.size, step)], 1))
        owner.append(owners(flat, node_offsets))
    # stable by owner, so each owner gets the queries of step 0, then step 1, ... from each rank
    asked = Requests(np.concatenate(keys).reshape(-1, 3), np.concatenate(owner), group)
    got, sender = asked.received, np.repeat(np.arange(w), asked.recv_sizes)
    routes = []
    for step, mine in enumerate(owner):
        here = got[:, 2] == step
        routes.append(Route(np.argsort(mine, kind="stable"), np.bincount(mine, minlength=w).tolist(),
                            np.bincount(sender[here], minlength=w).tolist(), got[here, 0],
                            np.ascontiguousarray(got[here, 1]).view(np.float64)))
    return routes


def served_rows(src: np.ndarray, dst: np.ndarray, t: np.ndarray, step: Route) -> tuple[np.ndarray, np.ndarray]:
    """The rows a rank embeds in a step with served negatives (nodes, times): its events'
    endpoints (src, then dst), then the queries other ranks sent it."""
    return np.concatenate([src, dst, step.nodes]), np.concatenate([t, t, step.times])
