"""gnndist.partition: split a static or temporal graph into parts, written as an on-disk store.

`partition_graph(graph, num_parts, method=...)` computes a `PartitionStore` (save it with
`.save(dir)` or pass `out=dir`); `load_partition(dir, part_id)` reads one `Partition` back.
"""
from gnndist.partition.book import PartitionBook
from gnndist.partition.methods import METHODS
from gnndist.partition.store import (
    FORMAT_VERSION,
    Partition,
    PartitionStore,
    RankPart,
    check_store_of,
    files_missing,
    is_store,
    load_id_maps,
    load_partition,
    open_part,
    partition_graph,
    read_store_meta,
    relabel,
    verify_store,
)

__all__ = ["FORMAT_VERSION", "METHODS", "Partition", "PartitionBook", "RankPart", "check_store_of", "PartitionStore", "files_missing", "is_store", "load_id_maps",
           "load_partition", "open_part", "partition_graph", "read_store_meta", "relabel", "verify_store"]
