"""Negatives embedded by their nodes' owners (partitioned memory): a rank sends the queries (node,
time) of its events' negatives to the negatives' owners, which embed them with their own events
(their state rows and most of their neighbours' rows live there) and send the embeddings back;
the trainer has it done in evaluation, where it moves a negative's embedding (4 bytes per
memory dimension) instead of the state rows of the node and its sampled neighbours.

Where a negative goes depends on the events only, so `route` sends the queries of a window of
steps in one exchange, ahead of the steps; a step then exchanges only the embeddings.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from gnndist.partition import PartitionBook
from gnndist.samplers.distributed import StepRequests, requests_per_step


def route_negatives(negatives: Sequence[tuple[np.ndarray, np.ndarray]], book: PartitionBook, group: Any
          ) -> list[StepRequests]:
    """Where the negatives of steps whose negatives and event times are `(neg [B, n], t [B])` are
    embedded, in one exchange for all (a collective, on the host group `group`): per step, this
    rank's negatives (flattened [B * n]) sent to their owners as (node, time) queries, and the
    queries other ranks sent here."""
    queries = [np.stack([neg.reshape(-1), np.repeat(t, neg.shape[1]).view(np.int64)], 1) for neg, t in negatives]
    return requests_per_step(queries, [book.owner(neg.reshape(-1)) for neg, _ in negatives], group)


def embedded_rows(src: np.ndarray, dst: np.ndarray, t: np.ndarray, step: StepRequests) -> tuple[np.ndarray, np.ndarray]:
    """The rows a rank embeds in a step with served negatives (nodes, times): its events'
    endpoints (src, then dst), then the queries other ranks sent it."""
    times = np.ascontiguousarray(step.received[:, 1]).view(np.float64)
    return np.concatenate([src, dst, step.received[:, 0]]), np.concatenate([t, t, times])
