"""What gnndist does, on built-in data in about a minute: partition a generated temporal graph
(`synthetic-temporal`) into 2 parts, train TGN link prediction on 2 local ranks that each hold
one part and the node memory of its own nodes (`--memory partitioned`, a `presample` edge-feature
cache), then on one process with the whole graph, and print what each rank held and moved beside
the metrics of both runs.

The same as `gnndist partition synthetic-temporal --parts 2 --out ST`, then
`gnndist train ST --task link --model tgn --nproc 2 --memory partitioned --cache presample` and
`gnndist train synthetic-temporal --task link --model tgn`.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from typing import Any, Optional

RANKS = 2
MIB = 1 << 20


def configure(p: argparse.ArgumentParser) -> None:
    """The subcommand's flags."""
    p.add_argument("--epochs", type=int, default=3, help="training epochs (default 3)")
    p.add_argument("--num-nodes", type=int, default=1000, help="nodes to generate (default 1000)")
    p.add_argument("--num-events", type=int, default=20000, help="events to generate (default 20000)")
    p.add_argument("--seed", type=int, default=0, help="random seed of data and training")
    p.add_argument("--metrics-out", default=None, metavar="FILE",
                   help="write the 2-rank run's metrics JSON, with the one-process run's under `one_process`")
    p.add_argument("--quiet", action="store_true", help="no progress bars or per-epoch lines")


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; the exit status."""
    from gnndist.temporal.config import LinkConfig

    t0 = time.perf_counter()
    cfg = LinkConfig(model="tgn", epochs=args.epochs, seed=args.seed, quiet=args.quiet,
                     memory="partitioned", cache="presample")  # checks the flags

    from gnndist.runtime import dist
    from gnndist.datasets import load
    from gnndist.outputs import Outputs, write_metrics
    from gnndist.partition import partition_graph
    from gnndist.temporal.fit import train_link

    dist.timeout_s()  # a bad GNNDIST_TIMEOUT is told before the data is made
    Outputs(metrics_out=args.metrics_out).check("synthetic-temporal")
    tg = load("synthetic-temporal", num_nodes=args.num_nodes, num_events=args.num_events, seed=args.seed)
    print(f"synthetic-temporal: {tg.num_nodes:,} nodes, {tg.num_events:,} events, {tg.edge_dim} edge features; "
          f"TGN link prediction, {args.epochs} epochs", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="gnndist-demo-") as tmp:
        store = partition_graph(tg, RANKS, method="temporal", out=f"{tmp}/store")
        print(partition_lines(store.stats), flush=True)
        print(f"\n== {RANKS} ranks, each with its part and its nodes' memory ==", flush=True)
        spread = train_link(f"{tmp}/store", cfg, nproc=RANKS)
    print("\n== 1 process, the whole graph ==", flush=True)
    one = train_link(tg, LinkConfig(model="tgn", epochs=args.epochs, seed=args.seed, quiet=args.quiet))
    print("\n" + summary(spread, one), flush=True)
    if args.metrics_out:
        write_metrics(args.metrics_out, {**spread, "one_process": one})
    print(f"done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


def partition_lines(stats: dict[str, Any]) -> str:
    """The partition: each part's nodes and events, and the events whose endpoints it splits."""
    lines = [f"partitioned into {len(stats['nodes_per_part'])} parts (temporal method): "
             f"{stats['cross_partition_event_fraction']:.1%} of events join nodes of two parts"]
    for p, (n, owned, held) in enumerate(zip(stats["nodes_per_part"], stats["events_per_part"],
                                            stats["stored_events_per_part"])):
        lines.append(f"  part {p}: {n:,} nodes, {owned:,} events from them, {held:,} events touching them")
    return "\n".join(lines)


def _num(v: Optional[float], fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def summary(spread: dict[str, Any], one: dict[str, Any]) -> str:
    """What each rank held and moved (the metrics JSON's `ranks` and the last epoch's traffic)
    beside the one process, and the test metrics of both runs."""
    ranks, whole = spread["ranks"], one["ranks"][0]
    cols = [f"rank {r['rank']}" for r in ranks] + ["1 process"]
    rows: list[tuple[str, list[str]]] = [
        ("events held", [f"{r['events_held']:,}" for r in ranks + [whole]]),
        ("node-state rows", [f"{r['node_state_rows']:,}" for r in ranks + [whole]]),
        ("MiB held", [f"{sum(r['bytes'].values()) / MIB:.2f}" for r in ranks + [whole]]),
        ("edge-cache hit rate", [_num(r["edge_cache"]["hit_rate"], ".2f") for r in ranks] + ["-"]),
        ("edge-feature MiB fetched", [f"{r['edge_cache']['bytes_fetched'] / MIB:.2f}" for r in ranks] + ["-"]),
    ]
    width = max(len(name) for name, _ in rows) + 2
    out = ["what each rank held (cache counters: its last training epoch)",
           " " * width + "".join(f"{c:>12}" for c in cols)]
    out += [f"{name:<{width}}" + "".join(f"{v:>12}" for v in vals) for name, vals in rows]
    e, e1 = spread["epochs"][-1], one["epochs"][-1]
    out += ["", f"moved between the {len(ranks)} ranks in the last epoch: {e['remote_rows']:,} node-state rows "
            f"({e['state_bytes'] / MIB:.1f} MiB), sampled neighbours {e['sample_bytes'] / MIB:.1f} MiB, "
            f"edge features {e['edge_feature_bytes'] / MIB:.1f} MiB, gradient sums {e['grad_bytes'] / MIB:.1f} MiB",
            f"events/s in the last epoch: {e['events_per_s']:,.0f} on {len(ranks)} ranks, "
            f"{e1['events_per_s']:,.0f} in 1 process", "",
            f"{'test':<{width}}{'AP':>12}{'AUC':>12}{'MRR':>12}"]
    for name, m in ((f"{len(ranks)} ranks", spread), ("1 process", one)):
        out.append(f"{name:<{width}}" + "".join(f"{_num(m['test'][k], '.4f'):>12}" for k in ("ap", "auc", "mrr")))
    out.append(f"(the {len(ranks)} ranks take one process's training steps on the same global batches; the metrics "
               "differ only as far as float summation order lets them drift)")
    return "\n".join(out)
