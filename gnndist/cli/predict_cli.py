"""Use a trained model on DATA: the best-validation parameters of CHECKPOINT, a folder written
by `gnndist train ... --checkpoint DIR`.

link models (temporal DATA):
  gnndist predict CKPT DATA --split test [-o test.json]
      the test metrics, as `gnndist train` printed them (and its metrics JSON's "test")
  gnndist predict CKPT DATA --candidates links.csv -o scores.csv
      each candidate link (CSV columns src,dst,t; the data's original node ids) scored after
      replaying every event before its time: columns src,dst,t,score,prob (score: the logit the
      link metrics rank; prob: its sigmoid); .npy: the scores alone
  gnndist predict CKPT DATA --embed-at T -o emb.npy
      every node's embedding at time T after replaying the events before T (.npy: row i is
      node i of the data's numbering, ascending original id; .csv: a node column first)
  gnndist predict CKPT DATA -o probs.csv
      of a `gnndist train --task node` run on temporal DATA (its decoder is in the checkpoint):
      per event, the class probabilities of its source, embedded as in training (.csv: columns
      event,p for two classes, event,p0,p1,... for more; .npy: the array)
node models (static DATA):
  gnndist predict CKPT DATA -o probs.npy [--ids ids.txt]
      class probabilities of every node (or of the ids listed one per line), over full
      neighbourhoods (.csv: columns node,p0,p1,...)

--nproc W runs W local ranks, each on its part of a partition store of W parts (raw DATA is
split as `gnndist train --nproc W` splits it); the metrics are those of one process. -o never
replaces an existing .npy or .csv, nor an input.
"""
from __future__ import annotations

import argparse

import numpy as np

from gnndist.cli.datasets_cli import add_data_args, source_from_args
from gnndist.errors import GnndistError
from gnndist.outputs import check_output, results_text, write_metrics
from gnndist.validate import DEVICES, Int, check

LINK_MODES = ("--split", "--candidates", "--embed-at")


def configure(p: argparse.ArgumentParser) -> None:
    """The subcommand\'s flags."""
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint folder from `gnndist train --checkpoint`")
    add_data_args(p)
    link = p.add_argument_group("link models")
    link.add_argument("--split", choices=("test",), default=None, help="the test metrics of the training data")
    link.add_argument("--candidates", default=None, metavar="FILE.csv",
                      help="score these links (columns src,dst,t) after replaying the events before each t")
    link.add_argument("--embed-at", type=float, default=None, metavar="T",
                      help="every node's embedding at time T")
    node = p.add_argument_group("node models")
    node.add_argument("--ids", default=None, metavar="FILE", help="classify only these node ids (one per line)")
    p.add_argument("-o", "--out", default=None, metavar="FILE",
                   help="where the predictions go (.npy or .csv; --split test: a metrics JSON)")
    p.add_argument("--nproc", type=int, default=1, help="local ranks (a store of W parts needs W)")
    p.add_argument("--device", choices=DEVICES, default="cpu", help="cpu (gloo) or cuda (NCCL)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; the exit status."""
    check("nproc", args.nproc, Int())
    from gnndist.partition import is_store
    from gnndist.runtime.dist import writes_outputs
    from gnndist.predict import SavedModel, check_predictions_out, read_candidates, read_ids, write_predictions

    saved = SavedModel.load(args.checkpoint)
    data = args.data if is_store(args.data) else source_from_args(args)
    saved.check_kind(data)  # before the flags of its task: they would not help with the other kind's data
    inputs = [args.checkpoint, args.data, args.candidates, args.ids]
    given = [flag for flag, value in zip(LINK_MODES, (args.split, args.candidates, args.embed_at)) if value is not None]
    run_opts = dict(nproc=args.nproc, device=args.device, quiet=args.quiet)
    if saved.task == "node":
        if given:
            raise GnndistError(f"{given[0]} is for link models; {args.checkpoint} holds a node model (give -o FILE)")
        if not args.out:
            raise GnndistError("give -o FILE (.npy or .csv): where the class probabilities go")
        check_predictions_out(args.out, inputs)
        from gnndist.static.predict import node_probabilities

        ids = read_ids(args.ids) if args.ids else None
        probs = node_probabilities(saved, data, ids, **run_opts)
        nodes = np.arange(probs.shape[0]) if ids is None else ids
        if writes_outputs():
            path = write_predictions(args.out, probs, [f"p{c}" for c in range(probs.shape[1])], {"node": nodes},
                                     inputs)
            print(f"wrote {path}: class probabilities of {probs.shape[0]:,} nodes")
        return 0
    if args.ids:
        raise GnndistError(f"--ids is for node models; {args.checkpoint} holds a link model")
    if not given and saved.decoder is not None:
        if not args.out:
            raise GnndistError("give -o FILE (.npy or .csv): where the events' class probabilities go (or one of "
                               f"{', '.join(LINK_MODES)} for the link model)")
        check_predictions_out(args.out, inputs)
        from gnndist.temporal.nodes import event_probabilities

        probs = event_probabilities(saved, data, **run_opts)
        if writes_outputs():
            names = ["p"] if probs.ndim == 1 else [f"p{c}" for c in range(probs.shape[1])]
            path = write_predictions(args.out, probs, names, {"event": np.arange(probs.shape[0])}, inputs)
            print(f"wrote {path}: class probabilities of the sources of {probs.shape[0]:,} events")
        return 0
    if len(given) != 1:
        raise GnndistError(f"a link model needs one of {', '.join(LINK_MODES)}" +
                           (f", not {' and '.join(given)} together" if given else ""))
    from gnndist.temporal import predict as link

    if args.split:
        if args.out and not args.out.lower().endswith(".json"):
            raise GnndistError(f"--split writes its metrics as JSON: give -o a .json path, not {args.out}")
        if args.out:
            check_output(args.out, "test_metrics", inputs, flag="-o")
        test = link.link_test(saved, data, **run_opts)
        if writes_outputs():
            print(results_text({"task": "link", "epochs": saved.history, "selected_epoch": saved.selected_epoch,
                                "test": test}), flush=True)
        if args.out and writes_outputs():
            path = write_metrics(args.out, {"task": "link", "model": saved.config.get("model"),
                                            "checkpoint": args.checkpoint, "selected_epoch": saved.selected_epoch,
                                            "world_size": args.nproc, "test": test}, flag="-o", kind="test_metrics")
            print(f"wrote {path}")
        return 0
    if not args.out:
        raise GnndistError(f"{given[0]} needs -o FILE (.npy or .csv): where the predictions go")
    check_predictions_out(args.out, inputs)
    if args.candidates:
        src, dst, t = read_candidates(args.candidates)
        score = link.link_scores(saved, data, src, dst, t, **run_opts)
        prob = (1 / (1 + np.exp(-score.astype(np.float64)))).astype(np.float32)
        values, names = (score, ["score"]) if args.out.lower().endswith(".npy") else (np.stack([score, prob], 1),
                                                                                       ["score", "prob"])
        if writes_outputs():
            path = write_predictions(args.out, values, names, {"src": src, "dst": dst, "t": t}, inputs)
            print(f"wrote {path}: scores of {score.size:,} candidate links")
        return 0
    emb = link.link_embeddings(saved, data, args.embed_at, **run_opts)
    if writes_outputs():
        keys = None if args.out.lower().endswith(".npy") else {"node": link.node_ids(data)}
        path = write_predictions(args.out, emb, [f"e{j}" for j in range(emb.shape[1])], keys, inputs)
        print(f"wrote {path}: embeddings of {emb.shape[0]:,} nodes at time {args.embed_at:g}")
    return 0
