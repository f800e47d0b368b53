"""Partition a temporal interaction graph and look at one part.

    python examples/partition_temporal.py uci    # a dataset name or a file; none: built-in data
"""
import sys

from gnndist.datasets import load
from gnndist.partition import load_partition, partition_graph

tg = load(sys.argv[1] if len(sys.argv) > 1 else "synthetic-temporal")
store = partition_graph(tg, 4, method="temporal", out="parts-example")
print(f"{tg.num_events:,} events -> 4 parts; cross-partition events: "
      f"{store.stats['cross_partition_event_fraction']:.3f}, "
      f"event imbalance: {store.stats['imbalance']['events']:.3f}")
part = load_partition("parts-example", 0, world_size=4)
print(f"part 0 owns new ids [{part.start}, {part.stop}) and stores {part.eid.size:,} events")
