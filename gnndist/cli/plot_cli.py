"""Draw a training run as one PNG: loss and validation metrics per epoch (the selected epoch
marked), the time split per epoch, and for distributed runs bytes moved and cache hit rate.

  gnndist plot RUN.json -o run.png [--dataset NAME]

RUN.json is a file from `gnndist train ... --metrics-out RUN.json` (with `--seeds`: each seed's
loss and validation curves side by side). The output is refused when
it is the input or an existing file gnndist did not write. Needs matplotlib:
pip install 'gnndist[plot]'.
"""
from __future__ import annotations

import argparse

from gnndist.plots import read_metrics, run_figure, save_png


def configure(p: argparse.ArgumentParser) -> None:
    """The subcommand\'s flags."""
    p.add_argument("metrics", metavar="RUN.json", help="a metrics file from `gnndist train --metrics-out`")
    p.add_argument("-o", "--out", required=True, metavar="PNG", help="the picture to write")
    p.add_argument("--dataset", default=None, metavar="NAME",
                   help="the dataset named in the title (default: the one the metrics record, if any)")


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; the exit status."""
    fig = run_figure(read_metrics(args.metrics), dataset=args.dataset)
    print(f"wrote {save_png(fig, args.out, inputs=[args.metrics])}")
    return 0
