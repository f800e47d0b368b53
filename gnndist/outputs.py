"""Where gnndist may write: one rule for every output path (partition stores, metrics JSON,
checkpoint folders, TensorBoard folders, plots, predictions), and how gnndist marks what it wrote.

`check_output(path, kind, inputs)` refuses, with one line naming the path and the reason:
- a path that is one of the run's `inputs`, contains one, or lies inside an input folder
  (compared after resolving symlinks, and by inode, so a hard link counts as the same file);
- an existing file or folder that gnndist did not write: a metrics file without the
  `"gnndist"` stamp that `write_metrics` puts in (and, for `gnndist predict`'s test metrics,
  a training run's metrics file), a store folder holding files its meta.json
  does not list, a checkpoint folder holding anything but checkpoint files, a TensorBoard
  folder holding anything but event files, a PNG without gnndist's Software text chunk;
- any existing predictions file (`gnndist predict -o`): a .npy or .csv carries no mark of its
  writer, so none is replaced.
What passes may be replaced: gnndist writes it atomically (gnndist.io).
"""
from __future__ import annotations

import json
import math
import os
import re
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Union

import gnndist
from gnndist.errors import GnndistError
from gnndist.io import real_path, write_json
from gnndist.runlog import require_tensorboard
from gnndist.validate import Int, OneOf, Real, check

PathLike = Union[str, os.PathLike]
# kind -> (what it is, in messages; the flag that names it; True for a folder)
KINDS = {"store": ("partition store", "--out", True), "metrics": ("metrics file", "--metrics-out", False),
         "test_metrics": ("test metrics", "-o", False),
         "checkpoint": ("checkpoint folder", "--checkpoint", True), "log_dir": ("log folder", "--log-dir", True),
         "plot": ("plot", "output path", False), "predictions": ("predictions", "-o", False)}
SOFTWARE = f"gnndist {gnndist.__version__}"  # the PNG tEXt "Software" value of gnndist's plots
# a checkpoint: after epoch N (validated), or after S training steps of epoch N; `checkpoint_name` writes it
CHECKPOINT_FILE = re.compile(r"epoch-(\d+)(?:-step-(\d+))?\.pt")
RANK_FOLDER = re.compile(r"rank(\d+)")  # the folder of rank r's epochs in a W-rank link run's checkpoint
REPLACED = ".replaced"  # the folder of a checkpoint that a running or failed run replaces (gnndist.checkpoint.run)
PROGRESS = ".progress"  # the last training step a rank finished (gnndist.resume: the steps a restart runs again)
# what a checkpoint folder may hold: checkpoint files (per rank in rank{r}/, replaced ones in .replaced/),
# the temp files of interrupted atomic writes (gnndist.io.atomic_file: ".NAME.tmp-XXXX") and a rank's
# progress file
_FILE = r"\.?epoch-\d+(-step-\d+)?\.pt(\.tmp-\w+)?"
_CHECKPOINT_ENTRY = re.compile(rf"(rank\d+/)?({re.escape(REPLACED)}/)?({_FILE}|{re.escape(PROGRESS)})")
_CHECKPOINT_TOP = re.compile(rf"rank\d+|{re.escape(REPLACED)}|{re.escape(PROGRESS)}|{_FILE}")  # its top-level names
_TFEVENTS = re.compile(r"(.+/)?events\.out\.tfevents\.[^/]+")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_MAX_METRICS_BYTES = 64 << 20  # a larger file is not a metrics file gnndist wrote


def checkpoint_name(epoch: int, step: Optional[int] = None) -> str:
    """File name of the checkpoint after epoch `epoch` (epoch-0003.pt), or after `step` training
    steps of it (epoch-0003-step-000120.pt)."""
    return f"epoch-{epoch:04d}.pt" if step is None else f"epoch-{epoch:04d}-step-{step:06d}.pt"


def plot_metadata() -> dict[str, str]:
    """PNG text chunks to write with a plot (matplotlib: `savefig(..., metadata=plot_metadata())`),
    so that `check_output(path, "plot")` knows the file as gnndist's."""
    return {"Software": SOFTWARE}


def write_metrics(path: PathLike, obj: dict[str, Any], flag: Optional[str] = None, kind: str = "metrics") -> Path:
    """Write `obj` as the metrics JSON file `path` (atomically), stamped with a top-level
    `"gnndist": {"version", "kind": "metrics"}` key; refused as `check_output(path, kind, flag=flag)`
    (`kind` "test_metrics": `gnndist predict --split test`'s, which replace no training run's)."""
    path = check_output(path, kind, flag=flag)
    write_json(path, {"gnndist": {"version": gnndist.__version__, "kind": "metrics"}, **obj})
    return path


def check_output(path: PathLike, kind: str, inputs: Iterable[Optional[PathLike]] = (),
                 flag: Optional[str] = None) -> Path:
    """`path` as a Path, after checking that writing a `kind` output there (store, metrics,
    checkpoint, log_dir, plot or predictions) loses nothing: see the module docstring. Raises
    GnndistError, naming `flag` (default: the kind's usual flag) as what to change."""
    what, usual_flag, folder = KINDS[kind]
    flag = flag or usual_flag
    out = Path(path)

    def refuse(why: str) -> GnndistError:
        return GnndistError(f"refusing to write the {what} to {out}: {why}; choose another {flag}")

    inputs = [Path(p) for p in inputs if p is not None and os.path.lexists(p)]
    target = real_path(out, flag)
    for inp in inputs:
        real = real_path(inp)
        if target == real:
            raise refuse(f"it is the input {inp}")
        if target in real.parents:
            raise refuse(f"it contains the input {inp}, which replacing it would delete")
        if real.is_dir() and real in target.parents:
            raise refuse(f"it is inside the input folder {inp}")
    parent = next((p for p in out.absolute().parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise refuse(f"{parent} is not a folder")
    if not os.path.lexists(out):
        return out
    if out.is_symlink() and not out.exists():
        raise refuse("it is a symlink to nothing")
    mode = out.stat().st_mode
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise refuse("it is not a regular file or folder")
    linked = _linked_input(out, inputs)
    if linked is not None:
        raise refuse(f"it {'holds' if stat.S_ISDIR(mode) else 'is'} a hard link to the input {linked}")
    if folder != stat.S_ISDIR(mode):
        raise refuse(f"it exists and is a {'file' if folder else 'folder'}")
    problem = _FOREIGN[kind](out)
    if problem:
        raise refuse(problem)
    return out


def _files(root: Path) -> list[Path]:
    """Every file, symlink or other non-folder entry at or below `root` (symlinks not followed)."""
    if root.is_symlink() or not root.is_dir():
        return [root]
    found = []
    for folder, dirs, files in os.walk(root):
        found += [Path(folder) / f for f in files]
        found += [Path(folder) / d for d in dirs if os.path.islink(Path(folder) / d)]
    return found


def _hard_linked(files: list[Path]) -> dict[tuple[int, int], Path]:
    """(device, inode) -> path of each of `files` that has another name (a link count above 1)."""
    stats = ((f, os.stat(f, follow_symlinks=False)) for f in files)
    return {(st.st_dev, st.st_ino): f for f, st in stats if st.st_nlink > 1}


def _linked_input(out: Path, inputs: list[Path]) -> Optional[Path]:
    """The input that a file at or below `out` is a hard link of (same device and inode), if any."""
    ids = {key: inp for inp in inputs for key in _hard_linked(_files(real_path(inp)))}
    return next((ids[key] for key in _hard_linked(_files(out)) if key in ids), None)


def _relative(root: Path) -> list[str]:
    """Paths of the entries below folder `root`, relative and with '/', folders included."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def _foreign_store(out: Path) -> Optional[str]:
    """Why the existing folder `out` is not a partition store gnndist may replace, or None: it
    must be empty or hold only meta.json and the files that meta.json lists."""
    found = [f for f in _relative(out) if (out / f).is_symlink() or not (out / f).is_dir()]
    if not found:
        return None
    if "meta.json" not in found:
        return "it exists and is not a partition store"
    try:
        listed = json.loads((out / "meta.json").read_text())["files"]
        listed = set(listed) | {"meta.json"}
    except (ValueError, UnicodeDecodeError, RecursionError, OSError, KeyError, TypeError):
        return ("its meta.json is unreadable, so the store's files cannot be told from others; delete the folder "
                "yourself")
    foreign = [f for f in found if f not in listed]
    return f"it holds {foreign[0]}, which the store did not write; move it away" if foreign else None


def _foreign_entries(pattern: re.Pattern, what: str):
    """A check that a folder holds only entries whose relative path matches `pattern`."""
    def check(out: Path) -> Optional[str]:
        foreign = [f for f in _relative(out) if (out / f).is_symlink()
                   or not (out / f).is_dir() and not pattern.fullmatch(f)]
        return f"it holds {foreign[0]}, which is not {what}" if foreign else None
    return check


_foreign_checkpoint = _foreign_entries(_CHECKPOINT_ENTRY, "a gnndist checkpoint file")


def _stamped_metrics(out: Path) -> Optional[dict[str, Any]]:
    """The existing file `out` as a metrics file that `write_metrics` wrote, or None."""
    if out.stat().st_size > _MAX_METRICS_BYTES:
        return None
    try:
        obj = json.loads(out.read_bytes())
    except (ValueError, RecursionError):
        return None
    stamp = obj.get("gnndist") if isinstance(obj, dict) else None
    return obj if isinstance(stamp, dict) and stamp.get("kind") == "metrics" else None


def _foreign_metrics(out: Path) -> Optional[str]:
    """Why the existing file `out` is not a metrics file that `write_metrics` wrote, or None."""
    return None if _stamped_metrics(out) is not None else \
        "it exists and is not a metrics file gnndist wrote (no \"gnndist\" stamp)"


def _foreign_test_metrics(out: Path) -> Optional[str]:
    """Why the existing file `out` may not be replaced by test metrics, or None: it must be a
    metrics file gnndist wrote, and not a training run's (whose per-epoch metrics would be lost)."""
    obj = _stamped_metrics(out)
    if obj is None:
        return _foreign_metrics(out)
    if "epochs" in obj or "runs" in obj:
        return "it holds a training run's metrics (per-epoch metrics), which the test metrics would replace"
    return None


def is_checkpoint_folder(path: PathLike) -> bool:
    """Whether `path` is a folder of `gnndist train --checkpoint`: checkpoint files and nothing
    else (as `check_output` takes one), at least one. Its top level is read first, so another
    folder is told apart without walking it."""
    p = Path(path)
    if not p.is_dir() or not all(_CHECKPOINT_TOP.fullmatch(f.name) for f in p.iterdir()):
        return False
    return _foreign_checkpoint(p) is None and any(f.is_file() for f in p.rglob("*"))


def gnndist_output(path: PathLike) -> Optional[str]:
    """What gnndist output `path` is, as a phrase for messages (a checkpoint folder or file, a
    partition store, a metrics file, test metrics, a plot), or None: for telling a user who
    gives one where a dataset is read what it is."""
    p = Path(path)
    if is_checkpoint_folder(p):
        return "a gnndist checkpoint folder (gnndist predict CHECKPOINT DATA uses it; gnndist info describes it)"
    if p.is_dir() and (p / "meta.json").is_file():
        return "a gnndist partition store (gnndist train and predict take it as DATA; gnndist info describes it)"
    if not p.is_file():
        return None
    if CHECKPOINT_FILE.fullmatch(p.name):
        return "a gnndist checkpoint file (gnndist predict takes its folder)"
    metrics = _stamped_metrics(p) if p.suffix.lower() == ".json" else None
    if metrics is not None:
        return ("a gnndist metrics file (gnndist plot draws it)" if "epochs" in metrics or "runs" in metrics else
                "the test metrics of gnndist predict")
    if p.suffix.lower() == ".png" and _png_software(p) == SOFTWARE:
        return "a plot gnndist drew"
    return None


def _png_software(path: Path) -> Optional[str]:
    """The PNG's tEXt "Software" value, or None (not a PNG, or no such chunk)."""
    with open(path, "rb") as f:
        if f.read(8) != _PNG_SIGNATURE:
            return None
        while len(head := f.read(8)) == 8:
            length, ctype = struct.unpack(">I4s", head)
            if ctype == b"tEXt":
                key, _, value = f.read(length).partition(b"\0")
                if key == b"Software":
                    return value.decode("latin1")
                f.seek(4, os.SEEK_CUR)
            elif ctype == b"IEND":
                return None
            else:
                f.seek(length + 4, os.SEEK_CUR)
    return None


def _foreign_plot(out: Path) -> Optional[str]:
    """Why the existing file `out` is not a plot gnndist wrote, or None."""
    software = _png_software(out)
    if software is not None and software.startswith("gnndist"):
        return None
    return "it exists and is not a PNG that gnndist wrote (no gnndist Software text chunk)"


def _existing_predictions(out: Path) -> str:
    """Why an existing file is not replaced by predictions: always (see the module docstring)."""
    return "it exists, and a predictions file is never replaced (nothing marks it as gnndist's); delete it"


_FOREIGN = {"store": _foreign_store, "metrics": _foreign_metrics, "test_metrics": _foreign_test_metrics,
            "plot": _foreign_plot,
            "predictions": _existing_predictions,
            "checkpoint": _foreign_checkpoint,
            "log_dir": _foreign_entries(_TFEVENTS, "a TensorBoard event file")}


@dataclass(frozen=True)
class Outputs:
    """Where a run writes: the metrics JSON (rank 0), the checkpoint folder (each epoch, and every
    `checkpoint_every` steps or `checkpoint_minutes` minutes within one; `gnndist.checkpoint`), and
    the TensorBoard folder (rank 0; `gnndist.runlog`). `resume`: True continues the checkpoint in
    `checkpoint` (on this or another number of ranks); "auto" continues it where it is this same
    run's (data, settings, ranks), else starts anew (`gnndist.resume`)."""

    metrics_out: Optional[str] = None
    checkpoint: Optional[str] = None
    resume: Union[bool, str] = False
    log_dir: Optional[str] = None
    checkpoint_every: Optional[int] = None
    checkpoint_minutes: Optional[float] = None
    keep_checkpoints: int = 2  # the complete checkpoints kept (the newest ones)

    def check(self, data: Any) -> None:
        """Refuse, before any work, outputs that would overwrite the input `data` (a path, a
        `DataSource`, or a graph) or files gnndist did not write (`check_output`), or one another.
        (Whether a checkpoint folder holds another run's is `gnndist.checkpoint.check_folder`'s.)"""
        check("resume", self.resume, OneOf((False, True, "auto"), "--resume takes no value or auto, got {got}"))
        check("checkpoint_every", self.checkpoint_every, Int(optional=True))
        check("checkpoint_minutes", self.checkpoint_minutes, Real(low_open=True, optional=True))
        check("keep_checkpoints", self.keep_checkpoints, Int())
        if self.checkpoint_every is not None and self.checkpoint_minutes is not None:
            raise GnndistError("--checkpoint-every and --checkpoint-minutes: give one of them")
        needs = [f for f, v in (("--resume", self.resume), ("--checkpoint-every", self.checkpoint_every),
                                ("--checkpoint-minutes", self.checkpoint_minutes)) if v not in (None, False)]
        if needs and not self.checkpoint:
            raise GnndistError(f"{needs[0]} needs --checkpoint DIR")
        given = [(f, real_path(p, f)) for f, p in (("--metrics-out", self.metrics_out),
                                                     ("--checkpoint", self.checkpoint), ("--log-dir", self.log_dir)) if p]
        for i, (flag_a, a) in enumerate(given):
            for flag_b, b in given[i + 1:]:
                if a == b or a in b.parents or b in a.parents:
                    raise GnndistError(f"{flag_a} and {flag_b} are " + (f"the same path ({a})" if a == b else
                                       f"nested paths ({a}, {b})") + ": give each output a place of its own")
        name = data if isinstance(data, (str, os.PathLike)) else getattr(data, "name", None)
        for path, kind in ((self.metrics_out, "metrics"), (self.checkpoint, "checkpoint"), (self.log_dir, "log_dir")):
            if path:
                check_output(path, kind, [name])
        if self.log_dir:
            require_tensorboard()


def report(metrics: dict[str, Any], outputs: Outputs) -> None:
    """The end of a training run, on the process that holds rank 0's metrics: print its results
    (`results_text`) and write the metrics JSON to `outputs.metrics_out`."""
    print(results_text(metrics), flush=True)
    if outputs.metrics_out:
        write_metrics(outputs.metrics_out, metrics)


def results_text(metrics: dict[str, Any]) -> str:
    """The test results of a run's metrics: a node run's line; a link run's table of AP, AUC and
    MRR (validation at the selected epoch, test, test on new nodes; '-' where a metric has no
    events to come from); a node task on a temporal graph's line, then its link model's table."""
    t = metrics["test"]
    if metrics.get("graph") == "temporal":
        def num(v: Optional[float]) -> str:
            return "-" if v is None else f"{v:.4f}"

        best = next(k for k in t if k.startswith("best_val_"))
        shown = ", ".join(f"{k} {num(v)}" for k, v in t.items() if k != best)
        return (f"{metrics['model']} + decoder on {metrics['world_size']} rank(s), --task {metrics['task']} "
                f"({metrics['labels']} labels): test {shown} (best val {best[len('best_val_'):]} {num(t[best])} at "
                f"decoder epoch {metrics['selected_epoch']})\nlink model:\n" + results_text(metrics["link"]))
    if metrics["task"] == "node":
        return (f"{metrics['model']} on {metrics['world_size']} rank(s): test_acc {t['acc']:.4f} "
                f"(best val_acc {t['best_val_acc']:.4f} at epoch {t['best_epoch']})")
    sel = next(h for h in metrics["epochs"] if h["epoch"] == metrics["selected_epoch"])
    return link_table([(f"val (epoch {sel['epoch']})", {k: sel[f"val_{k}"] for k in ("ap", "auc", "mrr")}),
                       ("test", t), (f"test new nodes ({t['inductive_events']:,} events)",
                                     {k: t[f"inductive_{k}"] for k in ("ap", "auc", "mrr")})])


def link_table(rows: list[tuple[str, dict[str, Optional[float]]]]) -> str:
    """AP, AUC and MRR of each named row; '-' where a metric is missing (None or NaN)."""
    def cell(v: Optional[float]) -> str:
        return f"{v:>8.4f}" if v is not None and math.isfinite(v) else f"{'-':>8}"

    lines = [f"{'':<30}{'AP':>8}{'AUC':>8}{'MRR':>8}"]
    lines += [f"{name:<30}" + "".join(cell(m[k]) for k in ("ap", "auc", "mrr")) for name, m in rows]
    return "\n".join(lines)
