"""Describe a partition store, a checkpoint folder, or a dataset before partitioning or training it.

  gnndist info STORE [--json] [--verify] [--plot parts.png]
      a store's quality metrics (computed when it was written): nodes, events or edges,
      training and halo nodes per part, imbalance, edge cut, cross-partition events, ...;
      --verify checks every file's sha256; --plot draws them as one PNG (needs matplotlib:
      pip install 'gnndist[plot]').
  gnndist info CHECKPOINT [--json]
      a checkpoint folder (gnndist train --checkpoint): the run's task, model and ranks, the
      data it was trained on, the epochs run and kept, the selected epoch and its validation
      metrics, the settings, and how `gnndist predict` uses it.
  gnndist info DATA [--nproc W] [--memory-dim D] [--json]
      DATA is a file, folder or built-in generator name: kind, nodes, edges or events, time
      span and resolution (smallest positive gap between distinct times), feature dims,
      labels, split sizes, degree statistics (temporal: events per node), and memory
      estimates: the peak of `gnndist partition` per method, and what each of W training
      ranks holds.
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any

from tqdm import tqdm

from gnndist.cli.datasets_cli import add_data_args, refuse_dataset_flags, source_from_args
from gnndist.datasets.describe import MEMORY_DIM, MEMORY_FORMULA, facts, format_facts, memory
from gnndist.datasets.registry import FORMATS, detect_format, format_name, refuse_gnndist_output
from gnndist.errors import GnndistError
from gnndist.graph import TemporalGraph
from gnndist.io import show_progress
from gnndist.outputs import is_checkpoint_folder
from gnndist.partition.info import format_summary, summary
from gnndist.partition.store import files_missing, is_store, read_store_meta, verify_store

__doc__ = (__doc__ or "") + "\n" + MEMORY_FORMULA  # the `gnndist info --help` text


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def configure(p: argparse.ArgumentParser) -> None:
    """The subcommand\'s flags."""
    add_data_args(p, checkpoints=True)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    store = p.add_argument_group("partition store")
    store.add_argument("--verify", action="store_true", help="check every file's sha256")
    store.add_argument("--plot", default=None, metavar="PNG", help="draw the per-part metrics as one PNG")
    data = p.add_argument_group("dataset")
    data.add_argument("--nproc", type=_positive_int, default=None, metavar="W",
                      help="training ranks to estimate per-rank memory for (default: 1)")
    data.add_argument("--memory-dim", type=_positive_int, default=None, metavar="D",
                      help=f"node memory size of the link models (default: {MEMORY_DIM})")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _store(args: argparse.Namespace) -> None:
    refuse_dataset_flags(args, ("--nproc", args.nproc), ("--memory-dim", args.memory_dim))
    meta = read_store_meta(args.data)
    checked = verify_store(args.data) if args.verify else 0  # before the plot: a failed check writes nothing
    if args.plot:
        from gnndist.plots import partition_figure, save_png

        save_png(partition_figure(meta), args.plot, inputs=[args.data])
    s = summary(meta)
    s["parts_here"] = [p for p in range(meta["num_parts"]) if not files_missing(args.data, meta, p)]
    print(json.dumps(s) if args.json else format_summary(s))
    absent = sorted(set(range(meta["num_parts"])) - set(s["parts_here"]))
    if absent and not args.json:
        print(f"this folder holds part{'s' if len(s['parts_here']) != 1 else ''} "
              f"{', '.join(map(str, s['parts_here'])) or 'none'} of {meta['num_parts']} (absent: "
              f"{', '.join(map(str, absent))}): enough for the ranks of those parts on this host, which need "
              "only meta.json, the id maps and their own parts")
    if args.verify and not args.json:
        print(f"verified: {checked} files match their sha256")
    if args.plot and not args.json:
        print(f"wrote {args.plot}")


def _dataset_summary(args: argparse.Namespace) -> dict[str, Any]:
    """What `info DATA --json` prints: DATA, its format, `facts` and the memory estimates."""
    with tqdm(total=3, desc="info", unit="step", disable=not show_progress(args.quiet)) as bar:
        bar.set_postfix_str("loading")
        if os.path.isdir(args.data) and args.format is None:
            refuse_gnndist_output(args.data)
            try:
                detect_format(args.data)
            except GnndistError:
                raise GnndistError(f"{args.data} is not a partition store (no meta.json), nor a dataset folder "
                                   f"gnndist can tell the format of (give --format: {', '.join(FORMATS)})") from None
        graph = source_from_args(args).load()
        if args.memory_dim is not None and not isinstance(graph, TemporalGraph):
            raise GnndistError(f"--memory-dim is the node memory of the link models; {args.data} is a static graph: "
                               f"leave it out")
        bar.update()
        bar.set_postfix_str("metrics")
        source = format_name(args.data, args.format)
        out = {"data": args.data, "format": source, **facts(graph)}
        bar.update()
        bar.set_postfix_str("memory estimate")
        out["memory"] = memory(graph, args.nproc or 1, args.memory_dim or MEMORY_DIM)
        bar.update()
    return out


_SHOWN_APART = ("task", "model", "world_size", "num_nodes", "num_events", "edge_dim", "num_features", "num_classes",
                "partition", "quiet")  # config keys `_checkpoint` shows on lines of their own, or not at all


def _checkpoint(args: argparse.Namespace) -> None:
    """`gnndist info CHECKPOINT`: what the run was and what `gnndist predict` would apply."""
    if args.verify or args.plot:
        raise GnndistError(f"{'--verify' if args.verify else '--plot'} applies to a partition store; "
                           f"{args.data} is a checkpoint folder")
    refuse_dataset_flags(args, ("--nproc", args.nproc), ("--memory-dim", args.memory_dim), what="a checkpoint folder")
    from gnndist.predict import describe_checkpoint

    c = describe_checkpoint(args.data)
    if args.json:
        print(json.dumps(c))
        return
    cfg, w = c["config"], c["world_size"]
    ranks = f"{w} ranks" + (f" (folders here: {', '.join(f'rank{r}/' for r in c['rank_folders'])})"
                            if c["rank_folders"] else "")
    def count(key: str) -> str:
        v = cfg.get(key)
        return f"{v:,}" if isinstance(v, int) else "?"

    data = (f"{count('num_nodes')} nodes, {count('num_events')} events, {count('edge_dim')} edge features"
            if c["task"] == "link" else f"{count('num_features')} features, {count('num_classes')} classes")
    val = ", ".join(f"{k} {v:.4f}" for k, v in c["selected_val"].items() if isinstance(v, (int, float)))
    modes = "--split test, --candidates FILE -o OUT, or --embed-at T -o OUT" if c["task"] == "link" else "-o OUT"
    within = "".join(f"; epoch {k['epoch']} at step {k['step']}" for k in c["checkpoints_kept"]
                     if k["step"] is not None)
    print("\n".join([
        f"{args.data}: checkpoint of a {c['task']} run, {c['model']} on {ranks if w > 1 else '1 process'}",
        f"trained on: {data}",
        f"epochs run: {c['epochs_run']} (kept: {', '.join(map(str, c['epochs_kept']))}{within}); selected epoch "
        f"{c['selected_epoch']}" + (f": val {val}" if val else ""),
        "settings: " + ", ".join(f"{k} {v}" for k, v in cfg.items() if k not in _SHOWN_APART),
        f"use: gnndist predict {args.data} DATA {modes}"]))


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; the exit status."""
    if is_store(args.data):
        _store(args)
        return 0
    if is_checkpoint_folder(args.data):
        _checkpoint(args)
        return 0
    if args.verify or args.plot:
        raise GnndistError(f"{'--verify' if args.verify else '--plot'} applies to a partition store; "
                           f"{args.data} is a dataset (partition it with `gnndist partition`)")
    s = _dataset_summary(args)
    print(json.dumps(s) if args.json else format_facts(s))
    return 0
