"""Split a graph into partitions and write them as an on-disk store.

  gnndist partition DATA --parts K --out DIR [--method metis|random|temporal|metis-lp|temporal-lp]
                   [--balance nodes,edges,train] [--imbalance-tol 1.03] [--halo 0|1]
                   [--replicate-hubs K] [--time-windows W] [--recency R] [--seed S] [--force]
                   [--nproc K] [--memory-budget SIZE]

DATA is a dataset name, a file or folder, or shard files of one graph. Methods: `metis`
(default for static graphs) balances the --balance weights within --imbalance-tol; `random`
hashes node ids; `temporal` (default for temporal graphs) cuts few events, weighting recent
ones more, and balances the events each part owns (an event belongs to its source node's part)
in each of --time-windows windows; `metis-lp` and `temporal-lp` are their balanced label
propagation, for projections larger than one rank's memory. The metrics are printed and kept
in DIR/meta.json (`gnndist info DIR`).

With --nproc K (or under torchrun, one rank per part, on one host or several) the ranks read
DATA's shard files and write one part each; no rank holds the whole graph. METIS runs on rank 0
where the projection fits --memory-budget, else the -lp method (the default method says which).
A rank keeps the part it writes within --memory-budget, spilling sorted runs to a folder beside
DIR (removed as they are merged into the part) beyond it.
"""
from __future__ import annotations

import argparse
import json
import sys

from gnndist.cli.datasets_cli import add_data_args, refuse_dataset_flags, source_from_args
from gnndist.errors import GnndistError
from gnndist.graph import Graph
from gnndist.io import show_progress
from gnndist.partition.info import format_summary, summary
from gnndist.partition.methods import IMBALANCE_TOL, LP_METHODS, METHODS
from gnndist.partition.stats import available_memory_bytes, fmt_bytes, graph_bytes, parse_size
from gnndist.outputs import check_output
from gnndist.partition.store import check_memory, is_store, partition_graph, read_store_meta


def configure(p: argparse.ArgumentParser) -> None:
    """The subcommand\'s flags."""
    add_data_args(p, stores=False)
    p.add_argument("--parts", type=int, required=True, metavar="K", help="number of parts, at most the node "
                   "count (temporal method: at most the nodes that are an event source)")
    p.add_argument("--out", required=True, metavar="DIR", help="store folder to write (replaced atomically; refused "
                   "when it is or holds DATA, or holds files an earlier store did not write)")
    p.add_argument("--method", choices=METHODS, default=None,
                   help="default: metis for static graphs, temporal for temporal graphs")
    p.add_argument("--balance", default=None, help="metis only: comma-separated weights to balance: "
                   "nodes, edges, train (temporal graphs: nodes, edges = events) (default: nodes)")
    p.add_argument("--imbalance-tol", type=float, default=None,
                   help="metis and temporal methods: the max/mean of each balanced weight METIS aims for, from "
                   f"1.001 to 10 (default: {IMBALANCE_TOL}); a note says where the partition is over it")
    p.add_argument("--halo", type=int, choices=(0, 1), default=0,
                   help="1: store each part's 1-hop halo ids and features (for tools that read the store; training "
                   "fetches remote features through its cache and does not read them)")
    p.add_argument("--replicate-hubs", type=int, default=0, metavar="K",
                   help="temporal: copy the events of the K busiest nodes into every part")
    p.add_argument("--time-windows", type=int, default=None, metavar="W",
                   help="temporal graphs: balance owned events in each of W time windows of equal event counts "
                   "(consecutive in time order); W from 1 to 64, "
                   "with at least 10 events per part in each window (default: 4, or as many as the events fill)")
    p.add_argument("--recency", type=float, default=None, metavar="R",
                   help="temporal method only: the latest events weigh 1+R times the first; from 0 to 1e6 "
                   "(default: 1)")
    p.add_argument("--seed", type=int, default=0, help="partitioner seed, from 0 to 2**32-1 (default: 0; METIS, "
                   "which the metis and temporal methods run, draws alike for seeds 0 and 1)")
    p.add_argument("--force", action="store_true", help="partition even if the memory estimate exceeds "
                   "the available memory")
    p.add_argument("--nproc", type=int, default=1, metavar="K",
                   help="partition across K local ranks, one part each, reading shard files (default: 1: in this "
                        "process); under torchrun the ranks torchrun starts")
    p.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="with --nproc: the memory each rank plans against, bytes or e.g. 2GiB (default: this "
                        "host's available memory / its ranks); METIS runs on rank 0 only where the projection fits it, "
                        "and a rank spills the part it writes to disk beyond it")
    p.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress bars or notes")


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; the exit status."""
    check_output(args.out, "store", [args.data])
    if is_store(args.data):
        raise GnndistError(f"{args.data} is a partition store: partition the graph it was made from (a store's "
                           f"parts are not read back as one graph)")
    balance = None if args.balance is None else [b.strip() for b in args.balance.split(",") if b.strip()]
    options = dict(method=args.method, balance=balance, imbalance_tol=args.imbalance_tol, halo=args.halo,
                   replicate_hubs=args.replicate_hubs, time_windows=args.time_windows, recency=args.recency,
                   seed=args.seed, force=args.force)
    from gnndist.runtime.dist import in_torchrun, writes_outputs
    from gnndist.runtime.launch import partition_data

    if args.nproc > 1 or in_torchrun():
        if args.memory_budget is not None:
            options["memory_budget"] = parse_size(args.memory_budget)
        refuse_dataset_flags(args, what="shard files partitioned across ranks") if args.format is None else None
        meta = partition_data(args.data, args.parts, args.out, args.nproc, args.quiet, **options)
        if not writes_outputs():
            return 0
    else:
        if args.memory_budget is not None:
            raise GnndistError("--memory-budget applies to partitioning across ranks (--nproc K)")
        graph = source_from_args(args).load()
        method = args.method or ("metis" if isinstance(graph, Graph) else "temporal")
        need = check_memory(graph, method, force=True)
        if need is not None and not args.quiet:
            avail = available_memory_bytes()
            loaded = graph_bytes(graph)
            print(f"estimated peak memory {fmt_bytes(loaded + need)}: the graph {fmt_bytes(loaded)} + {fmt_bytes(need)} "
                  "to partition" + (f" ({fmt_bytes(avail)} available)" if avail is not None else ""), file=sys.stderr)
        partition_graph(graph, args.parts, out=args.out, progress=show_progress(args.quiet), **{**options, "method": method})
        meta = read_store_meta(args.out)
    s = summary(meta)
    print(json.dumps(s) if args.json else f"wrote {args.out}\n{format_summary(s)}")
    over = over_tolerance(s)
    if over and not args.quiet:
        who = "label propagation" if s["method"].endswith("-lp") else "METIS"
        print(f"note: {who} left {', '.join(f'{k} at {v:.3f}' for k, v in over.items())} over --imbalance-tol "
              f"{s['params']['imbalance_tol']:g} (it aims for the tolerance and does not always meet it; "
              + ("fewer --time-windows, " if s["method"].startswith("temporal") else "") + "fewer parts or a looser "
              "tolerance help)", file=sys.stderr)
    return 0


def over_tolerance(s: dict) -> dict[str, float]:
    """The balanced weights of a METIS or temporal store (its `summary`) whose max/mean is over
    the store's --imbalance-tol."""
    params = s["params"]
    balanced = {"metis": params.get("balance", ["nodes"]), "temporal": ["events", "events_worst_window"]}
    balanced.update({lp: balanced[m] for m, lp in LP_METHODS.items()})
    tol = params.get("imbalance_tol")
    return {k: v for k, v in s["imbalance"].items() if k in balanced.get(s["method"], []) and v > tol}
