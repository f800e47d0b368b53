"""Chronological splits of a temporal graph, and the nodes first seen after training."""
from __future__ import annotations

from typing import Union

import numpy as np

from gnndist.errors import GnndistError
from gnndist.graph import TemporalGraph


def chronological_split(events: Union[TemporalGraph, int], val: float = 0.15, test: float = 0.15
                        ) -> tuple[int, int]:
    """Event positions `(train_end, val_end)` of a graph (or of `events` events in time order):
    train = [0, train_end), val = [train_end, val_end), test = [val_end, E). The last `test`
    fraction of events is test, the `val` fraction before it validation (each rounded to whole
    events)."""
    if not (0 <= val < 1 and 0 <= test < 1 and val + test < 1):
        raise GnndistError(f"split fractions must be >= 0 with val + test < 1, got val={val}, test={test}")
    e = events.num_events if isinstance(events, TemporalGraph) else int(events)
    val_end = e - int(round(e * test))
    train_end = val_end - int(round(e * val))
    return train_end, val_end


def new_nodes_after(tgraph: TemporalGraph, train_end: int) -> np.ndarray:
    """Sorted ids of the nodes that take part in some event at position >= `train_end` but in
    none before it (the unseen nodes of inductive evaluation)."""
    if not 0 <= train_end <= tgraph.num_events:
        raise GnndistError(f"train_end must be in [0, {tgraph.num_events}], got {train_end}")
    seen = np.zeros(tgraph.num_nodes, dtype=bool)
    seen[tgraph.src[:train_end]] = True
    seen[tgraph.dst[:train_end]] = True
    later = np.zeros(tgraph.num_nodes, dtype=bool)
    later[tgraph.src[train_end:]] = True
    later[tgraph.dst[train_end:]] = True
    return np.flatnonzero(later & ~seen)
