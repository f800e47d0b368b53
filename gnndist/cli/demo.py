"""A short TGN training on built-in synthetic data (`synthetic-temporal`), in one process.

Trains a few epochs of link prediction on a generated interaction graph and prints the
validation and test metrics (AP, ROC-AUC, MRR; random negatives), like
`gnndist train synthetic-temporal --task link --model tgn` does.
"""
from __future__ import annotations

import argparse
import sys
import time


def configure(p: argparse.ArgumentParser) -> None:
    """The subcommand\'s flags."""
    p.add_argument("--epochs", type=int, default=3, help="training epochs (default 3)")
    p.add_argument("--num-nodes", type=int, default=1000, help="nodes to generate (default 1000)")
    p.add_argument("--num-events", type=int, default=20000, help="events to generate (default 20000)")
    p.add_argument("--seed", type=int, default=0, help="random seed of data and training")
    p.add_argument("--metrics-out", default=None, metavar="FILE", help="write the metrics as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bars or per-epoch lines")


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; the exit status."""
    from gnndist.temporal.config import LinkConfig

    t0 = time.perf_counter()
    cfg = LinkConfig(model="tgn", epochs=args.epochs, seed=args.seed, quiet=args.quiet)  # checks the flags

    from gnndist.runtime import dist
    from gnndist.datasets import load
    from gnndist.outputs import Outputs
    from gnndist.temporal.fit import train_link

    dist.timeout_s()  # a bad GNNDIST_TIMEOUT is told before the data is made
    outputs = Outputs(metrics_out=args.metrics_out)
    outputs.check("synthetic-temporal")
    tg = load("synthetic-temporal", num_nodes=args.num_nodes, num_events=args.num_events, seed=args.seed)
    print(f"synthetic-temporal: {tg.num_nodes} nodes, {tg.num_events} events, {tg.edge_dim} edge features; "
          f"TGN, {args.epochs} epochs", file=sys.stderr)
    train_link(tg, cfg, outputs=outputs)
    print(f"done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0
