"""Pictures of a training run (its metrics JSON) and of a partition store (its meta.json).

`run_figure(metrics)` (`seeds_figure` for the runs of `--seeds`) and `partition_figure(meta)` return a matplotlib `Figure` (no pyplot
state is touched); `save_png(fig, path, inputs)` writes it atomically, marked as written by
gnndist so that a later call may replace it but never a file gnndist did not write.
matplotlib is the optional extra: `pip install 'gnndist[plot]'`.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence, Union

import numpy as np

from gnndist.errors import GnndistError
from gnndist.io import atomic_file, real_path
from gnndist.outputs import check_output, plot_metadata

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PANEL_INCHES = (4.8, 3.4)  # width, height of one panel
TITLE_INCHES = 0.8  # room above the panels for the two-line title
DPI = 100
TIME_PARTS = ("sample_s", "fetch_s", "compute_s", "sync_s")
BYTES_KEYS = ("bytes", "remote_bytes")  # link trainer, node trainer
HIT_RATE_KEYS = ("cache_hit_rate", "edge_cache.hit_rate")

PathLike = Union[str, "os.PathLike[str]"]


def _new_figure(panels: int, title: str) -> tuple["Figure", list["Axes"]]:
    """A figure of `panels` panels (3 a row, 2 when that gives fewer empty slots) under `title`."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise GnndistError("drawing a figure needs matplotlib: pip install 'gnndist[plot]'") from None
    cols = 2 if panels in (2, 4) else min(panels, 3)
    rows = math.ceil(panels / cols)
    fig = Figure(figsize=(cols * PANEL_INCHES[0], rows * PANEL_INCHES[1] + TITLE_INCHES), dpi=DPI,
                 layout="constrained")
    axes = list(fig.subplots(rows, cols, squeeze=False).ravel())
    for ax in axes[panels:]:
        ax.remove()
    fig.suptitle(title)
    return fig, axes[:panels]


def size_pixels(fig: "Figure") -> tuple[int, int]:
    """(width, height) in pixels of the PNG `save_png` writes for `fig`."""
    w, h = fig.get_size_inches() * fig.dpi
    return int(round(w)), int(round(h))


# ------------------------------------------------------------------------------------ a run

def _number(v: Any) -> Optional[float]:
    """`v` as a float when it is a finite number (JSON null, NaN, text and lists are not)."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def series(epochs: Sequence[dict], key: str) -> np.ndarray:
    """`key` of every epoch record as floats, NaN where absent or not a number; a dotted key
    reaches into a nested dict (`edge_cache.hit_rate`)."""
    out = []
    for rec in epochs:
        v: Any = rec
        for part in key.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        x = _number(v)
        out.append(np.nan if x is None else x)
    return np.array(out, dtype=np.float64)


def _present(epochs: Sequence[dict], keys: Iterable[str]) -> list[str]:
    """The keys with a number in at least one epoch."""
    return [k for k in keys if np.isfinite(series(epochs, k)).any()]


def epochs_of(metrics: Any, where: str = "the metrics") -> list[dict]:
    """The per-epoch records of a metrics dict, checked to be a non-empty list of objects."""
    epochs = metrics.get("epochs") if isinstance(metrics, dict) else None
    if not isinstance(epochs, list) or not all(isinstance(r, dict) for r in epochs):
        raise GnndistError(f"{where} holds no per-epoch metrics (an 'epochs' list): "
                           "is it a file from `gnndist train --metrics-out`?")
    if not epochs:
        raise GnndistError(f"{where} holds no epochs")
    return epochs


def read_metrics(path: PathLike) -> dict:
    """A metrics JSON written by `gnndist train --metrics-out`, checked to hold epochs (in each
    run, for one of `--seeds`)."""
    real_path(path)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise GnndistError(f"{path}: no such file") from None
    except (IsADirectoryError, UnicodeDecodeError):
        raise GnndistError(f"{path}: not a metrics JSON file") from None
    try:
        metrics = json.loads(text)
    except ValueError as e:
        raise GnndistError(f"{path}: not valid JSON ({e})") from None
    runs = metrics.get("runs") if isinstance(metrics, dict) else None
    if runs is None:
        epochs_of(metrics, str(path))
        return metrics
    seeds = metrics.get("seeds")  # `gnndist train --seeds`: a run per seed
    if not isinstance(runs, list) or not runs or not isinstance(seeds, list) or len(seeds) != len(runs):
        raise GnndistError(f"{path} holds no runs of --seeds (a 'runs' list, one per 'seeds' entry): is it a file "
                           "from `gnndist train --metrics-out`?")
    for i, run in enumerate(runs):
        epochs_of(run, f"{path} (run {i + 1})")
    return metrics


def selected_epoch(metrics: dict) -> Optional[int]:
    """The epoch whose parameters were kept: `selected_epoch`, else `test.best_epoch`."""
    test = metrics.get("test")
    for v in (metrics.get("selected_epoch"), test.get("best_epoch") if isinstance(test, dict) else None):
        if _number(v) is not None:
            return int(v)
    return None


TEST_FIGURES = (("ap", "AP"), ("auc", "AUC"), ("mrr", "MRR"), ("acc", "accuracy"))  # key, name in titles


def _run_head(metrics: dict, dataset: Optional[str]) -> str:
    """Dataset, model and world size (and memory mode) of a run."""
    cfg = metrics.get("config") if isinstance(metrics.get("config"), dict) else {}
    if dataset is None:
        dataset = next((metrics[k] for k in ("dataset", "data") if isinstance(metrics.get(k), str)), None)
    if dataset is None and _number(cfg.get("num_events")) is not None and _number(cfg.get("num_nodes")) is not None:
        dataset = f"{int(cfg['num_nodes']):,} nodes, {int(cfg['num_events']):,} events"
    world = int(_number(metrics.get("world_size")) or 1)
    head = f"{dataset or 'unnamed data'}: {metrics.get('model', '?')}, {world} rank{'s' if world > 1 else ''}"
    if isinstance(metrics.get("memory"), str):
        head += f", {metrics['memory']} memory"
    return head


def _run_title(metrics: dict, dataset: Optional[str]) -> str:
    """`_run_head`; then the test metrics and the stop reason when recorded."""
    test = metrics.get("test") if isinstance(metrics.get("test"), dict) else {}
    shown = [f"test {name} {test[k]:.4f}" for k, name in TEST_FIGURES if _number(test.get(k)) is not None]
    if isinstance(metrics.get("stop_reason"), str):
        shown.append(f"stopped: {metrics['stop_reason']}")
    return _run_head(metrics, dataset) + ("\n" + ", ".join(shown) if shown else "")


def _mark_selected(ax: "Axes", epoch: Optional[int]) -> None:
    if epoch is not None:
        ax.axvline(epoch, color="0.4", linestyle="--", linewidth=1, label=f"selected epoch {epoch}")


def run_figure(metrics: dict, dataset: Optional[str] = None) -> "Figure":
    """One figure of a training run from its metrics dict: loss and validation metrics per epoch
    (the selected epoch marked), the time split per epoch (stacked sample / fetch / compute /
    sync seconds, else the epoch time), and for distributed runs the bytes moved and the cache
    hit rate per epoch. Absent metrics are left out. The title names `dataset` (default: the
    metrics' `dataset` or `data`), the model and the world size. The metrics of `gnndist train
    --seeds` (a `runs` list) give `seeds_figure`."""
    if metrics.get("runs") is not None:
        return seeds_figure(metrics, dataset)
    epochs = epochs_of(metrics)
    x = series(epochs, "epoch")
    if not np.isfinite(x).all():
        x = np.arange(1, len(epochs) + 1, dtype=np.float64)
    world = int(_number(metrics.get("world_size")) or 1)
    scores = _present(epochs, sorted({k for r in epochs for k in r if k.startswith("val_")}) + ["train_acc"])
    parts = _present(epochs, TIME_PARTS) or _present(epochs, ["time_s"])
    moved = _present(epochs, BYTES_KEYS)[:1] if world > 1 else []
    hits = _present(epochs, HIT_RATE_KEYS)[:1] if world > 1 else []
    drawn = ["loss"] + (["scores"] if scores else []) + (["time"] if parts else []) + \
        (["bytes"] if moved else []) + (["hits"] if hits else [])
    fig, axes = _new_figure(len(drawn), _run_title(metrics, dataset))
    ax = dict(zip(drawn, axes))
    sel = selected_epoch(metrics)

    a = ax["loss"]
    a.plot(x, series(epochs, "loss"), marker="o", label="training loss")
    _mark_selected(a, sel)
    a.set(title="training loss", xlabel="epoch")
    a.legend(fontsize="small")
    if scores:
        a = ax["scores"]
        for k in scores:
            y = series(epochs, k)
            line, = a.plot(x, y, marker="o", label=k.replace("_", " "))
            if sel is not None and sel in x and k.startswith("val_"):
                a.plot([sel], [y[list(x).index(sel)]], marker="*", markersize=14, color=line.get_color())
        _mark_selected(a, sel)
        a.set(title="validation" + (" and training accuracy" if "train_acc" in scores else ""), xlabel="epoch")
        a.legend(fontsize="small")
    if parts:
        a = ax["time"]
        bottom = np.zeros(len(epochs))
        for k in parts:
            y = np.nan_to_num(series(epochs, k))
            a.bar(x, y, bottom=bottom, label="epoch" if k == "time_s" else k[:-2])
            bottom += y
        a.set(title="time per epoch (s)", xlabel="epoch")
        a.legend(fontsize="small")
    if moved:
        a = ax["bytes"]
        a.bar(x, np.nan_to_num(series(epochs, moved[0])) / 2**20, color="tab:purple")
        a.set(title="bytes moved per epoch (MiB)", xlabel="epoch")
    if hits:
        a = ax["hits"]
        a.plot(x, series(epochs, hits[0]), marker="o", color="tab:green")
        a.set(title="cache hit rate per epoch", xlabel="epoch", ylim=(0, 1))
    from matplotlib.ticker import MaxNLocator

    for a in axes:
        a.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # whole epochs, not too many
        a.set_xlim(x.min() - 0.5, x.max() + 0.5)  # a whole epoch around each: one epoch is no fraction of one
    return fig


def seeds_figure(metrics: dict, dataset: Optional[str] = None) -> "Figure":
    """The runs of `gnndist train --seeds` (`metrics["runs"]`, one per `metrics["seeds"]` entry,
    checked by `read_metrics`) side by side: each seed's training
    loss and main validation metric (AP for link, accuracy for node) per epoch, its selected
    epoch starred; the title gives each test metric's mean and standard deviation over the seeds."""
    runs, seeds = metrics["runs"], metrics["seeds"]
    key = "val_ap" if metrics.get("task") == "link" else "val_acc"
    summary = metrics.get("summary") if isinstance(metrics.get("summary"), dict) else {}
    shown = [f"test {name} {summary[k]['mean']:.4f} ± {summary[k]['std']:.4f}" for k, name in TEST_FIGURES
             if isinstance(summary.get(k), dict) and _number(summary[k].get("mean")) is not None
             and _number(summary[k].get("std")) is not None]
    fig, (loss, val) = _new_figure(2, f"{_run_head(runs[0], dataset)}, seeds {', '.join(map(str, seeds))}" +
                                   ("\n" + ", ".join(shown) if shown else ""))
    for seed, run in zip(seeds, runs):
        epochs = epochs_of(run)
        x = series(epochs, "epoch")
        line, = loss.plot(x, series(epochs, "loss"), marker="o", label=f"seed {seed}")
        y = series(epochs, key)
        val.plot(x, y, marker="o", color=line.get_color(), label=f"seed {seed}")
        sel = selected_epoch(run)
        if sel is not None and sel in x:
            val.plot([sel], [y[list(x).index(sel)]], marker="*", markersize=14, color=line.get_color())
    loss.set(title="training loss", xlabel="epoch")
    val.set(title=f"validation {'AP' if key == 'val_ap' else 'accuracy'} (selected epochs starred)", xlabel="epoch")
    from matplotlib.ticker import MaxNLocator

    for a in (loss, val):
        a.legend(fontsize="small")
        a.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    return fig


# ------------------------------------------------------------------------------ a partition

def _per_part_panel(ax: "Axes", counts: Sequence[int], what: str, imbalance: Optional[float]) -> None:
    """Bars of one number per part, the mean dashed, max/mean in the title."""
    c = np.asarray(counts, dtype=np.float64)
    ax.bar(np.arange(c.size), c)
    if c.size:
        ax.axhline(c.mean(), color="0.3", linestyle="--", linewidth=1, label=f"mean {c.mean():,.0f}")
        ax.legend(fontsize="small", loc="lower right")
    if imbalance is None:
        imbalance = float(c.max() / c.mean()) if c.size and c.mean() > 0 else 1.0
    ax.set(title=f"{what} per part (max/mean {imbalance:.3f})", xlabel="part")
    ax.set_xticks(np.arange(c.size))


def cross_fractions(meta: dict) -> dict[str, float]:
    """The cross-partition metrics of a store: label -> fraction."""
    s = meta["stats"]
    if meta["kind"] == "static":
        return {"edges cut": s["edge_cut_fraction"]}
    out = {"events crossing": s["cross_partition_event_fraction"]}
    if meta.get("replicated_hubs"):
        out["crossing, no hub"] = s["cross_partition_event_fraction_with_replicas"]
    out["node pairs cut"] = s["edge_cut_fraction"]
    return out


def partition_figure(meta: dict) -> "Figure":
    """One figure of a partition store from its meta.json (`read_store_meta`): per part the
    nodes, events (owned and stored) or edges, training nodes and halo nodes, and the
    cross-partition fractions against a random partition's; imbalance metrics in the title."""
    s, k, temporal = meta["stats"], int(meta["num_parts"]), meta["kind"] == "temporal"
    imb = s.get("imbalance", {})
    panels: list[tuple[str, str, Optional[float]]] = [("nodes_per_part", "nodes", imb.get("nodes"))]
    if temporal:
        panels += [("events_per_part", "owned events", imb.get("events")),
                   ("stored_events_per_part", "stored events", None)]
    else:
        panels.append(("edges_per_part", "edges (CSR entries)", imb.get("edges")))
    if "train_nodes_per_part" in s:
        panels.append(("train_nodes_per_part", "training nodes", imb.get("train")))
    panels.append(("halo_nodes_per_part", "halo nodes", None))
    size = f"{meta['num_events']:,} events" if temporal else f"{meta['num_edges']:,} edges"
    title = (f"{meta['kind']} graph, {meta['num_nodes']:,} nodes, {size}: {meta['method']}, {k} parts\n"
             "imbalance (max/mean): " + ", ".join(f"{n.replace('_', ' ')} {v:.3f}" for n, v in imb.items()))
    fig, axes = _new_figure(len(panels) + 1, title)
    for ax, (key, what, im) in zip(axes, panels):
        _per_part_panel(ax, s[key], what, im)
    ax = axes[-1]
    fractions = cross_fractions(meta)
    bars = ax.bar(range(len(fractions)), list(fractions.values()), color="tab:orange")
    ax.bar_label(bars, fmt="%.3f")
    ax.axhline(1 - 1 / k, color="0.3", linestyle="--", linewidth=1, label=f"random partition {1 - 1 / k:.3f}")
    ax.set_xticks(range(len(fractions)), list(fractions))
    ax.set(title="cross-partition fraction", ylim=(0, 1))
    ax.legend(fontsize="small")
    return fig


# ------------------------------------------------------------------------------ writing

def save_png(fig: "Figure", path: PathLike, inputs: Sequence[PathLike] = ()) -> Path:
    """Write `fig` to `path` (a .png name) as a PNG of `size_pixels(fig)`, atomically, after
    `check_output`."""
    check_output(path, "plot", inputs)
    if not str(path).lower().endswith(".png"):
        raise GnndistError(f"plots are written as PNG: give a .png path, not {path}")
    with atomic_file(path, "wb") as f:
        fig.savefig(f, format="png", metadata=plot_metadata())
    return Path(path)
