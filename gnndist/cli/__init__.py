"""The `gnndist` command line: one subcommand per module, each with `configure` and `run`."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import select
import signal
import sys
import time

# torch's C++ warnings (a store socket that timed out, with C++ frames) would bury the one line a
# distributed failure ends with; it reads this once, when it loads. --debug shows them.
if "--debug" not in sys.argv[1:]:
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
from typing import Optional, Sequence

from gnndist.errors import GnndistError, allocating, first_line

EPILOG = """examples:
  gnndist demo
  gnndist datasets
  gnndist train uci --task link --model tgn --epochs 5 --metrics-out tgn.json
  gnndist train cora --task node --model sage --nproc 2 --metrics-out sage.json --log-dir runs/sage
  gnndist train synthetic-temporal --task link --nproc 2 --memory partitioned
  gnndist partition uci --parts 4 --out uci4/
  gnndist partition synthetic-static --parts 4 --method metis --balance nodes,train --out parts/
  gnndist info uci4/ --json
  gnndist info cora --nproc 4
  gnndist plot sage.json -o sage.png
  gnndist train uci --task link --checkpoint uci_tgn/
  gnndist predict uci_tgn/ uci --split test
  gnndist predict uci_tgn/ uci --candidates links.csv -o scores.csv
  gnndist predict uci_tgn/ uci --embed-at 1.09e9 -o emb.npy
  gnndist train cora --task node --checkpoint cora_sage/
  gnndist predict cora_sage/ cora -o probs.csv

the guide: README.md and docs/ in the source tree
"""

# subcommand -> (module that implements it, one-line help)
SUBCOMMANDS = {
    "datasets": ("gnndist.cli.datasets_cli", "list the built-in datasets and the file formats gnndist reads"),
    "partition": ("gnndist.cli.partition_cli", "split a graph into partitions written as an on-disk store"),
    "info": ("gnndist.cli.info_cli", "describe a partition store, a checkpoint folder, or a dataset before partitioning or training it"),
    "train": ("gnndist.cli.train", "train a temporal (link) or static (node) GNN, on one or many ranks"),
    "predict": ("gnndist.cli.predict_cli", "use a trained model: test metrics, link scores, embeddings, class "
                "probabilities"),
    "plot": ("gnndist.cli.plot_cli", "draw a training run's metrics JSON as one PNG"),
    "demo": ("gnndist.cli.demo", "partition generated data, train TGN on 2 ranks and on one process, and "
             "show what each rank held and moved"),
}


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(command: Optional[str] = None) -> argparse.ArgumentParser:
    """The `gnndist` parser; only `command`'s module is imported and its flags added (the others
    are listed with their help line), so that help and usage errors come at once."""
    parser = _Parser(prog="gnndist", description="Train graph neural networks on graphs too large "
                     "for one GPU or one machine.", epilog=EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, (module, help_) in SUBCOMMANDS.items():
        if name != command:
            sub.add_parser(name, help=help_)
            continue
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=help_, description=(mod.__doc__ or help_).strip(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show full tracebacks on errors")
        mod.configure(p)
        p.set_defaults(run=mod.run)
    return parser


def _command(argv: Sequence[str]) -> Optional[str]:
    """The subcommand argv names: its first word that is not an option (the top level has only
    --debug and --help)."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the `gnndist` console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(_command(argv)).parse_args(argv)
    if args.debug:
        os.environ["GNNDIST_DEBUG"] = "1"  # ranks started by --nproc show their tracebacks too
    try:
        with allocating(f"gnndist {args.command}"):
            return int(args.run(args) or 0)
    except BrokenPipeError as e:
        if _stdout_gone():  # the reader of the output went away (`| head`): stop quietly, as SIGPIPE would
            return 128 + signal.SIGPIPE
        return _error(args, e)
    except (GnndistError, OSError) as e:
        return _error(args, e)
    except KeyboardInterrupt as e:
        print("gnndist: interrupted" + (f" ({e})" if str(e) else ""), file=sys.stderr)
        return 130


def _stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has gone (then it is pointed at /dev/null: nothing
    more to flush at exit); another broken pipe is an error like others."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):
        return False
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    gone = any(events & select.POLLERR for _, events in poll.poll(0))
    if gone:
        os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
    return gone


def _error(args: argparse.Namespace, e: BaseException) -> int:
    """The one error line (the traceback with --debug); exit status 2."""
    if args.debug:
        raise e
    line = f"gnndist {args.command}: error: {first_line(e)}"
    print(line, file=sys.stderr, flush=True)
    _tell_torchrun(line)
    return 2


def _tell_torchrun(line: str) -> None:
    """Under torchrun, leave the error line in the file its failure summary shows (it would show a
    link to its docs instead)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        try:
            with open(path, "w") as f:
                json.dump({"message": {"message": line, "extraInfo": {"py_callstack": line,
                                                                      "timestamp": str(int(time.time()))}}}, f)
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main())
