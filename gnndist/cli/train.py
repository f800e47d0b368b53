"""Train a GNN.

  --task link: memory-based temporal GNN (tgn, jodie, apan, dyrep, tgat) on a temporal graph
  --task node: node classification (sage, gcn, gat) on a static graph; on a temporal graph with
               event labels (JODIE's state_label), dynamic node classification: the link model,
               then a decoder on its embeddings at each labelled event (AUC, or accuracy and F1)
  --task node-property: TGB's node property prediction (tgbn-*): the link model, then a decoder
               on its embeddings at each label time (NDCG@10)

DATA is a built-in dataset name, a file or folder, or a partition store written by
`gnndist partition`. With --nproc W > 1 it starts W local ranks (torch's elastic
launcher); under torchrun it joins the run torchrun describes.
"""
from __future__ import annotations

import argparse

from gnndist.cli.datasets_cli import add_data_args, refuse_dataset_flags, source_from_args
from gnndist.datasets.registry import data_kind
from gnndist.errors import GnndistError
from gnndist.static.config import MODELS as STATIC_MODELS, NodeConfig
from gnndist.temporal.config import (LR_SCHEDULES, MEMORY_MODES, NEG_STRATEGIES, SAMPLINGS, SHARES,
                                     MODELS as TEMPORAL_MODELS, DecoderConfig, LinkConfig)
from gnndist.validate import CACHE_POLICIES, DEVICES, TASK_OF_KIND, Int, check, check_seeds, flag

# the config fields set by flags: of both tasks, of link prediction only, of node classification only
COMMON_FLAGS = ("epochs", "patience", "batch_size", "lr", "cache", "cache_size", "device", "seed", "quiet")
LINK_FLAGS = ("lr_schedule", "clip_grad", "memory_dim", "sampling", "neg", "memory", "share")
NODE_FLAGS = ("fanouts", "eval_fanouts", "hidden", "dropout", "weight_decay", "row_norm")
DECODER_FLAGS = ("hidden", "dropout", "weight_decay")  # of a node task's decoder on a temporal graph


def _ints(s: str) -> list[int]:
    """Comma-separated integers (their ranges are the configs' to check)."""
    try:
        return [int(x) for x in s.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None


def _defaults(name: str, tasks: tuple[str, ...] = ("link", "node")) -> str:
    """The config field's defaults, for a flag's help: per task, and per model where a task's
    models differ (`MODEL_DEFAULTS` of each task)."""
    def shown(v) -> str:
        if isinstance(v, list):
            return ",".join(map(str, v))
        return "none" if v is None else f"{v:g}" if isinstance(v, float) else str(v)

    configs = {"link": {m: LinkConfig(model=m) for m in TEMPORAL_MODELS},
               "node": {m: NodeConfig.for_model(m) for m in STATIC_MODELS}}
    parts = {}
    for task in tasks:
        per_model = {m: shown(getattr(cfg, name)) for m, cfg in configs[task].items()}
        values = set(per_model.values())
        parts[task] = values.pop() if len(values) == 1 else ", ".join(f"{m} {v}" for m, v in per_model.items())
    text = ("; ".join(f"{task} {v}" for task, v in parts.items()) if len(set(parts.values())) > 1
            else next(iter(parts.values())))
    return f"(default: {text})"


def configure(p: argparse.ArgumentParser) -> None:
    """The subcommand\'s flags."""
    add_data_args(p)
    p.add_argument("--task", choices=("link", "node", "node-property"), default=None,
                   help="link prediction on temporal graphs; node classification on static ones, or on temporal "
                        "ones with event labels (a decoder on the link model's embeddings); node-property: TGB's "
                        "tgbn-* task (default: link or node, from the data)")
    p.add_argument("--model", default=None,
                   help=f"link: {'|'.join(TEMPORAL_MODELS)} (default tgn); node: {'|'.join(STATIC_MODELS)} "
                        "(default sage); each model takes its own defaults where a flag below names them per model, "
                        "and a flag given wins")
    p.add_argument("--epochs", type=int, default=None, help=f"most training epochs {_defaults('epochs')}")
    p.add_argument("--patience", type=int, default=None,
                   help="stop after this many epochs without a better validation metric (AP / accuracy); "
                        f"the best-validation parameters are tested {_defaults('patience')}")
    p.add_argument("--batch-size", type=int, default=None,
                   help=f"global batch size (events or seed nodes) {_defaults('batch_size')}")
    p.add_argument("--lr", type=float, default=None, help=f"learning rate {_defaults('lr')}")
    p.add_argument("--seed", type=int, default=None, help="random seed (default 0)")
    p.add_argument("--seeds", type=_ints, default=None, metavar="S,S,...",
                   help="train once per seed and report the mean and standard deviation (replaces --seed)")
    p.add_argument("--device", choices=DEVICES, default="cpu", help="cpu (gloo) or cuda (NCCL)")
    p.add_argument("--nproc", type=int, default=1, help="local ranks to start")
    p.add_argument("--metrics-out", default=None, metavar="FILE", help="write per-epoch and test metrics as JSON "
                   "(rank 0 writes it)")
    p.add_argument("--quiet", action="store_true", help="no progress bars or per-epoch lines")
    p.add_argument("--log-dir", default=None, metavar="DIR",
                   help="write TensorBoard event files here: the loss of every step, every metric of every epoch, "
                        "the test metrics (rank 0; needs the tensorboard package)")
    p.add_argument("--checkpoint", default=None, metavar="DIR",
                   help="write a checkpoint each epoch here (for --resume, restarts, and `gnndist predict`)")
    p.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                   help="also write one every N training steps (written in the background)")
    p.add_argument("--checkpoint-minutes", type=float, default=None, metavar="M",
                   help="also write one every M minutes (instead of --checkpoint-every)")
    p.add_argument("--keep-checkpoints", type=int, default=2, metavar="K",
                   help="keep the newest K complete checkpoints (default 2), and the ones they build on")
    p.add_argument("--resume", nargs="?", const=True, default=False, choices=("auto",),
                   help="continue the checkpoint in --checkpoint (on this or another number of ranks); "
                        "--resume auto: continue it if it is this same run's (data, flags, ranks), else start anew")
    p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="with --nproc: start the ranks again after one fails, up to N times; each restart resumes "
                        "from the newest checkpoint every rank completed (under torchrun: torchrun --max-restarts)")
    p.add_argument("--cache", choices=CACHE_POLICIES, default=None,
                   help="cache of remote rows (node features; edge features of sampled events)")
    p.add_argument("--cache-size", type=float, default=None,
                   help="cache capacity: a fraction (<= 1) of the remote rows, or bytes (> 1) (default 0.1)")
    link = p.add_argument_group("link prediction (temporal)")
    link.add_argument("--memory-dim", type=int, default=None, help=f"node memory size {_defaults('memory_dim', ('link',))}")
    link.add_argument("--sampling", choices=SAMPLINGS, default=None,
                      help="temporal neighbours: the most recent before each event, or uniform draws among them "
                           "(default recent; JODIE samples none)")
    link.add_argument("--lr-schedule", choices=LR_SCHEDULES, default=None,
                      help="learning rate per epoch: constant, or cosine decay over --epochs (default constant)")
    link.add_argument("--clip-grad", type=float, default=None, metavar="NORM",
                      help="clip the summed gradient to this global norm (default: no clipping)")
    link.add_argument("--neg", choices=NEG_STRATEGIES, default=None,
                      help="negative sampling for evaluation")
    link.add_argument("--memory", choices=MEMORY_MODES, default=None,
                      help="how node memory is held across ranks")
    link.add_argument("--share", choices=SHARES, default=None,
                      help="which rank scores each event of a global batch: even (default; the owners of the "
                           "events' sources send a surplus over an even portion to ranks below it, so that no rank "
                           "waits for a busier one at each step) or owner (the owner of its source; no event "
                           "travels)")
    node = p.add_argument_group("node classification (static; on a temporal graph --hidden, --dropout and "
                                "--weight-decay set the decoder's)")
    node.add_argument("--fanouts", type=_ints, default=None,
                      help="per-hop fanouts (-1: all; a list that starts with -1 takes '=': --fanouts=-1,10) "
                           f"{_defaults('fanouts', ('node',))}")
    node.add_argument("--eval-fanouts", type=_ints, default=None,
                      help="per-hop fanouts at evaluation (default: all neighbours, --eval-fanouts=-1,-1)")
    node.add_argument("--hidden", type=int, default=None, help=f"hidden size {_defaults('hidden', ('node',))}")
    node.add_argument("--dropout", type=float, default=None, help=f"dropout rate {_defaults('dropout', ('node',))}")
    node.add_argument("--weight-decay", type=float, default=None, help="Adam weight decay (default 5e-4)")
    node.add_argument("--row-norm", choices=("auto", "on", "off"), default=None,
                      help="divide each node's features by their sum, like PyG's NormalizeFeatures "
                           "(default auto: when no feature is negative, e.g. bag-of-words)")


def link_config(args: argparse.Namespace) -> LinkConfig:
    """The `LinkConfig` the flags describe (unset flags keep its defaults)."""
    names = ("model",) + COMMON_FLAGS + LINK_FLAGS
    return LinkConfig(**{n: getattr(args, n) for n in names if getattr(args, n, None) is not None})


def node_config(args: argparse.Namespace) -> NodeConfig:
    """The `NodeConfig` the flags describe (unset flags keep the model's defaults)."""
    return NodeConfig.for_model(args.model or "sage", **{n: getattr(args, n, None) for n in COMMON_FLAGS + NODE_FLAGS})


def decoder_config(args: argparse.Namespace) -> DecoderConfig:
    """The `DecoderConfig` the flags describe (unset flags keep its defaults)."""
    return DecoderConfig(**{n: getattr(args, n) for n in DECODER_FLAGS if getattr(args, n, None) is not None})


def check_flags(args: argparse.Namespace, temporal_node: bool = False) -> None:
    """Refuse, before any work, flags of the other task and bad values of flags that are no
    config field (the configs check their own). `temporal_node`: a node task on a temporal graph,
    which takes the link flags (its link model's) and the decoder's."""
    if temporal_node:
        given = [n for n in NODE_FLAGS if n not in DECODER_FLAGS and getattr(args, n, None) is not None]
        if given:
            raise GnndistError(f"{flag(given[0])} applies to node classification on static graphs only (this run "
                               f"is --task {args.task} on a temporal graph)")
        if args.model is not None and args.model not in TEMPORAL_MODELS:
            raise GnndistError(f"--task {args.task} on a temporal graph takes a link model for its embeddings: "
                               f"--model {'|'.join(TEMPORAL_MODELS)}, got {args.model!r}")
    else:
        other = NODE_FLAGS if args.task == "link" else LINK_FLAGS
        given = [n for n in other if getattr(args, n, None) is not None]
        if given:
            raise GnndistError(f"{flag(given[0])} applies to --task {'node' if args.task == 'link' else 'link'} "
                               f"only (this run is --task {args.task})")
    check("nproc", args.nproc, Int())
    if args.seeds is not None:
        check_seeds("seeds", args.seeds)
        if args.seed is not None:
            raise GnndistError("--seed and --seeds together: --seeds runs one training per seed; give one of them")
        if args.max_restarts:
            raise GnndistError("--seeds runs several trainings; it takes no --max-restarts")


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; the exit status. The flags are checked before torch loads."""
    if args.task is None:
        if args.model is not None and args.model not in STATIC_MODELS + TEMPORAL_MODELS:
            raise GnndistError(f"--model must be one of {', '.join(TEMPORAL_MODELS)} (link) or "
                               f"{', '.join(STATIC_MODELS)} (node), got {args.model!r}")
        kind = data_kind(args.data, args.format)
        model_kind = kind if args.model is None else "static" if args.model in STATIC_MODELS else "temporal"
        if model_kind != kind:
            models = STATIC_MODELS if kind == "static" else TEMPORAL_MODELS
            raise GnndistError(f"--model {args.model} trains on {model_kind} graphs; DATA is a {kind} graph: "
                               f"use --model {', '.join(models)}")
        args.task = TASK_OF_KIND[kind]
    temporal_node = args.task != "link" and data_kind(args.data, args.format) == "temporal"
    if args.task == "node-property" and not temporal_node:
        raise GnndistError("--task node-property needs a temporal graph with node labels over time (TGB's tgbn-*)")
    check_flags(args, temporal_node)
    cfg = node_config(args) if args.task == "node" and not temporal_node else link_config(args)

    from gnndist.errors import allocating
    from gnndist.outputs import Outputs
    from gnndist.runtime.launch import over_seeds
    from gnndist.partition import is_store

    if temporal_node:
        from gnndist.temporal.nodes import train_temporal_node

        decoder = decoder_config(args)

        def train(data, cfg, nproc=1, outputs=Outputs(), max_restarts=0):
            return train_temporal_node(data, cfg, decoder, args.task, nproc, outputs, max_restarts)
    elif args.task == "node":
        from gnndist.static.trainer import train_node as train
    else:
        from gnndist.temporal.fit import train_link as train
    if is_store(args.data):
        refuse_dataset_flags(args)
    data = args.data if is_store(args.data) else source_from_args(args)
    outputs = Outputs(args.metrics_out, args.checkpoint, args.resume, args.log_dir, args.checkpoint_every,
                      args.checkpoint_minutes, args.keep_checkpoints)
    with allocating(f"gnndist train on {args.data}"):
        if args.seeds is None:
            train(data, cfg, args.nproc, outputs, args.max_restarts)
        else:
            over_seeds(train, data, cfg, args.seeds, args.nproc, outputs)
    return 0
