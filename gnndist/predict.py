"""Using a trained model: what both tasks' predictions share. The model of a checkpoint folder
(`SavedModel`: its best-validation parameters and the settings it was trained with), the data it
is applied to (checked against the checkpoint), node ids and candidate rows read from files,
and prediction files written as `.npy` or `.csv`.

The link task is in `gnndist.temporal.predict`, the node task in `gnndist.static.predict`; the
command is `gnndist predict CHECKPOINT DATA` (`gnndist.cli.predict_cli`).
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from gnndist import checkpoint
from gnndist.runtime import dist
from gnndist.datasets import DataSource
from gnndist.datasets.text import check_finite, check_ids, read_table
from gnndist.errors import GnndistError
from gnndist.graph import Graph, TemporalGraph, as_node_ids
from gnndist.io import atomic_file, real_path
from gnndist.runtime.launch import Data, kind_of
from gnndist.outputs import CHECKPOINT_FILE, REPLACED, check_output
from gnndist.partition import is_store
from gnndist.validate import TASK_OF_KIND

PathLike = Union[str, os.PathLike]
KIND_OF_TASK = {task: kind for kind, task in TASK_OF_KIND.items()}
SUFFIXES = (".npy", ".csv")


@dataclass(frozen=True)
class SavedModel:
    """The selected (best-validation) parameters of a training checkpoint, with what was saved
    beside them: the task, the run's settings (`config`), the epoch they were selected at and
    the per-epoch history."""

    path: str
    task: str  # "link" | "node"
    config: dict[str, Any]
    params: dict[str, Any]  # a model state_dict
    epoch: int  # the checkpoint's epoch
    selected_epoch: int
    history: list[dict[str, Any]]
    decoder: Optional[dict[str, Any]] = None  # a temporal node run's decoder (`gnndist.temporal.nodes`)

    @classmethod
    def load(cls, directory: PathLike) -> "SavedModel":
        """The model of the newest epoch of the checkpoint folder `directory` (written by
        `gnndist train --checkpoint DIR`; a run of W > 1 link ranks: its lowest rank folder here,
        as every rank holds the same parameters)."""
        real_path(directory)
        directory = Path(directory)
        if not directory.is_dir():
            raise GnndistError(f"{directory} is not a checkpoint folder (one written by gnndist train --checkpoint DIR)")
        folder = checkpoint.model_folder(directory)
        if not any(CHECKPOINT_FILE.fullmatch(f.name) for f in folder.iterdir()):
            aside = folder / REPLACED
            raise GnndistError(f"no checkpoint in {folder} (no epoch-NNNN.pt files from gnndist train --checkpoint DIR)"
                               + (f"; an earlier run's checkpoint is kept in {aside}" if checkpoint.epochs(aside) else ""))
        payload = checkpoint.load(folder)
        best, config = payload.get("best"), payload.get("config")
        if best is None and isinstance(config, dict):
            raise GnndistError(f"{folder} holds no trained model yet: its newest checkpoint is of epoch "
                               f"{payload['epoch']}, step {payload.get('step')}, before the first validation")
        if not isinstance(best, dict) or not isinstance(config, dict) or "model" not in best:
            raise GnndistError(f"{folder} holds no trained model (no best-validation parameters)")
        task = "node" if config.get("task") == "node" else "link"
        params = best["model"] if best["model"] is not None else payload["model"]  # no validation metric
        return cls(str(directory), task, config, params, int(payload["epoch"]), int(best["epoch"]),
                   list(payload.get("history", [])), payload.get("decoder"))

    def fingerprint(self) -> dict[str, Any]:
        """What every rank of a job using this model must share (`launch.check_same_job`): its
        task, the run's config, the selected epoch and a digest of the parameters; not the
        folder's path, nor the history, whose timings are each rank's own."""
        digest = hashlib.sha256()
        for name in sorted(self.params):
            digest.update(name.encode())
            digest.update(self.params[name].detach().cpu().contiguous().numpy().tobytes())
        return {"task": self.task, "config": self.config, "selected_epoch": self.selected_epoch,
                "parameters": digest.hexdigest()[:16]}

    def load_params(self, model: torch.nn.Module) -> None:
        """Put the selected parameters into `model` (one line where they do not fit it)."""
        checkpoint.load_params(model, self.params, self.path)

    def settings(self, cls: type, defaults: Optional[dict[str, Any]] = None, **overrides: Any) -> Any:
        """The saved run's config as a `cls` (`LinkConfig`, `NodeConfig`): its fields of `cls`
        over `defaults` (of fields older checkpoints lack), with `overrides`. A cache size saved
        without a cache (configs held one before a size was a cache's only) is left out."""
        names = {f.name for f in fields(cls)}
        saved = {**(defaults or {}), **{k: v for k, v in self.config.items() if k in names}}
        if saved.get("cache", "none") == "none":
            saved.pop("cache_size", None)
        return cls(**{**saved, **overrides})

    def check_kind(self, data: Data) -> None:
        """A one-line error when `data` is not of the graph kind this model's task takes."""
        want, kind = KIND_OF_TASK[self.task], kind_of(data)
        if kind != want:
            raise GnndistError(f"{self.path} holds a {self.task} model, which needs a {want} graph; DATA is {kind}")

    def check_sizes(self, what: dict[str, int]) -> None:
        """A one-line error when the data's sizes (e.g. num_nodes) differ from the training data's."""
        for key, value in what.items():
            if key in self.config and self.config[key] != value:
                raise GnndistError(f"{self.path} was trained on data with {key.replace('_', ' ')} {self.config[key]}, "
                                   f"DATA has {value}")


def describe_checkpoint(directory: PathLike) -> dict[str, Any]:
    """What `gnndist info CHECKPOINT` shows of a checkpoint folder: the run's task, model and
    ranks, the epochs it ran, the epochs kept (ended, validated) and every checkpoint kept, the
    selected epoch with its validation metrics, and the run's settings (`config`)."""
    saved = SavedModel.load(directory)
    folder = Path(directory)
    selected = next((h for h in saved.history if h.get("epoch") == saved.selected_epoch), {})
    kept = checkpoint.positions(checkpoint.model_folder(folder))
    return {"checkpoint": str(directory), "task": saved.task, "model": saved.config.get("model"),
            "world_size": saved.config.get("world_size", 1), "rank_folders": checkpoint.rank_folders_in(folder),
            "epochs_run": len(saved.history), "epochs_kept": [p.epoch for p in kept if p.step is None],
            "checkpoints_kept": [{"epoch": p.epoch, "step": p.step} for p in kept],
            "selected_epoch": saved.selected_epoch,
            "selected_val": {k[4:]: v for k, v in selected.items() if k.startswith("val_")}, "config": saved.config}


Checkpoint = Union[PathLike, SavedModel]  # a checkpoint folder, or its model already loaded


def saved_model(checkpoint: Checkpoint, task: str) -> SavedModel:
    """The `task` ("link" or "node") model of a checkpoint folder (or `checkpoint` itself when
    already loaded); a one-line error when the folder holds the other task's model."""
    saved = checkpoint if isinstance(checkpoint, SavedModel) else SavedModel.load(checkpoint)
    if saved.task != task:
        what = {"link": "link prediction", "node": "node classification"}[task]
        raise GnndistError(f"{saved.path} holds a {saved.task} model; this is a {what}")
    return saved


def source_of(data: Data) -> Union[DataSource, Graph, TemporalGraph, str]:
    """`data` with a str that names no partition store made a DataSource (what `run_job` takes)."""
    if isinstance(data, (str, os.PathLike)) and not is_store(data):
        return DataSource(str(data))
    return str(data) if isinstance(data, os.PathLike) else data


def gather_rows(rows: np.ndarray, values: torch.Tensor, n: int, device: torch.device) -> np.ndarray:
    """The [n, ...] array of every rank's `values` placed at their `rows` (NaN where no rank has
    a row), on every rank (a collective)."""
    rows_all = torch.cat(dist.all_gather_varsize(torch.from_numpy(rows).to(device))).cpu().numpy()
    vals_all = torch.cat(dist.all_gather_varsize(values.to(device))).cpu().numpy()
    out = np.full((n, *vals_all.shape[1:]), np.nan, dtype=vals_all.dtype)
    out[rows_all] = vals_all
    return out


def to_positions(ids: np.ndarray, known: Optional[np.ndarray], num_nodes: int) -> np.ndarray:
    """Positions of `ids` among the nodes of the data: in `known`, its sorted distinct original
    ids (None: the ids are the positions 0 .. num_nodes-1); a one-line error naming the first id
    that is no node of the data."""
    ids = as_node_ids("node ids", ids)
    if known is None:
        pos, bad = ids, np.flatnonzero((ids < 0) | (ids >= num_nodes))
    elif known.size == 0:
        pos, bad = ids, np.arange(ids.size)
    else:
        pos = np.minimum(np.searchsorted(known, ids), known.size - 1)
        bad = np.flatnonzero(known[pos] != ids)
    if bad.size:
        raise GnndistError(f"node id {ids[bad[0]]} is not a node of DATA")
    return pos


def read_ids(path: PathLike) -> np.ndarray:
    """Node ids from a text file, one per line ('#' comments and blank lines skipped)."""
    _, a = read_table(str(path), ncols=1, check=lambda v, _: check_ids(v, (0,)), what="node id")
    return a[:, 0].astype(np.int64)


def read_candidates(path: PathLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, t) of a CSV of candidate links: a header naming the columns src, dst and t (in
    any order; other columns ignored), or no header and the columns in that order."""
    def header_problem(names: list[str]) -> Optional[str]:
        missing = [c for c in ("src", "dst", "t") if [n.lower() for n in names].count(c) != 1]
        return f"the header needs one column each named src, dst and t (missing or repeated: {', '.join(missing)})" \
            if missing else None

    def columns(names: Optional[list[str]]) -> list[int]:
        return [0, 1, 2] if names is None else [[n.lower() for n in names].index(c) for c in ("src", "dst", "t")]

    def check(values: np.ndarray, names: Optional[list[str]]):
        if values.shape[1] < 3:
            return 0, "expected the 3 columns src, dst, t"
        if names is not None and values.shape[1] != len(names):
            return 0, f"expected {len(names)} fields (one per header name), got {values.shape[1]}"
        s, d, t = columns(names)
        return check_ids(values, (s, d)) or check_finite(values[:, [t]], ["t"])

    names, a = read_table(str(path), sep=",", header=True, check=check, header_problem=header_problem)
    s, d, t = columns(names)
    return a[:, s].astype(np.int64), a[:, d].astype(np.int64), a[:, t]


def check_predictions_out(path: PathLike, inputs: Sequence[Optional[PathLike]]) -> Path:
    """`path` checked as a predictions file to write (`.npy` or `.csv`; see
    `gnndist.outputs.check_output`, kind "predictions")."""
    if Path(path).suffix.lower() not in SUFFIXES:
        raise GnndistError(f"-o {path}: predictions are written as .npy or .csv; name the file so")
    return check_output(path, "predictions", inputs)


def write_predictions(path: PathLike, values: np.ndarray, names: Sequence[str],
                      keys: Optional[dict[str, np.ndarray]] = None, inputs: Sequence[Optional[PathLike]] = ()) -> Path:
    """Write `values` [n] or [n, k] atomically: `.npy`, the array itself; `.csv`, a header
    (the `keys` columns, then `names`, one per value column) and one row per value row."""
    path = check_predictions_out(path, inputs)
    values = np.asarray(values)
    if path.suffix.lower() == ".npy":
        with atomic_file(path) as f:
            np.save(f, values)
        return path
    table = values.reshape(values.shape[0], -1)
    keys = keys or {}
    cols = [np.asarray(v) for v in keys.values()] + [table[:, j] for j in range(table.shape[1])]
    formats = [_format(c) for c in cols]
    with atomic_file(path, "w") as f:
        f.write(",".join([*keys, *names]) + "\n")
        for row in zip(*cols):
            f.write(",".join(fmt % v for fmt, v in zip(formats, row)) + "\n")
    return path


def _format(column: np.ndarray) -> str:
    """printf format that writes a column's values back exactly (integers as integers)."""
    if np.issubdtype(column.dtype, np.integer):
        return "%d"
    return "%.9g" if column.dtype == np.float32 else "%.17g"
