"""Accuracy with the defaults: every model on the shared datasets, mean and std over seeds.

    python benchmarks/accuracy.py                          # the tables of docs/benchmarks.md
    python benchmarks/accuracy.py --only link --datasets uci --models tgn --seeds 0
    python benchmarks/accuracy.py --only dynamic-node --seeds 0   # state labels of generated events

Each cell is one `gnndist train DATA --task T --model M --seeds 0,1,2` in a fresh process, with
nothing else set: what a user gets from the defaults. Printed beside it: the published number
(see ../shared/datasets/README.md), the test metric, epochs trained and epoch selected of each
seed, and the wall time of each run (a default run must finish in under 10 minutes on the 2-core
machine).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gnndist.static.config import MODELS as NODE_MODELS
from gnndist.temporal.config import MODELS as LINK_MODELS

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
# dataset -> the DATA arguments of `gnndist train`
LINK = {"uci": [str(DATA / "uci_collegemsg" / "CollegeMsg.txt.gz")],
        "bitcoin-otc": [str(DATA / "bitcoin_otc" / "soc-sign-bitcoinotc.csv.gz")]}
NODE = {"cora": [str(DATA / "cora")], "citeseer": [str(DATA / "citeseer")]}
# dynamic node classification: generated events with their sources' state labels, as JODIE's files have
DYNAMIC_NODE = {"bursts": ["synthetic-temporal", "--session-labels", "6"]}
# published test metrics (AP for link prediction on UCI, random negatives; accuracy for node)
PUBLISHED = {("uci", "tgn"): 0.923, ("uci", "jodie"): 0.894, ("uci", "tgat"): 0.796, ("uci", "dyrep"): 0.651,
             ("cora", "gcn"): 0.815, ("cora", "gat"): 0.830, ("citeseer", "gcn"): 0.703, ("citeseer", "gat"): 0.725}


def run(data: list[str], task: str, model: str, seeds: str, tmp: Path) -> tuple[dict, float]:
    out = tmp / "m.json"
    out.unlink(missing_ok=True)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "gnndist", "train", *data, "--task", task, "--model", model,
                        "--seeds", seeds, "--quiet", "--metrics-out", str(out)], capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"gnndist train {' '.join(data)} --model {model} failed:\n{p.stderr[-2000:]}")
    return json.loads(out.read_text()), time.perf_counter() - t0


def table(task: str, key: str, datasets: dict, models: list[str], seeds: str, tmp: Path) -> None:
    print(f"\n{task}: test {key}, mean ± std over seeds {seeds}, defaults only")
    head = (f"{'dataset':<13}{'model':<7}{'test':>17}{'published':>11}{'per seed':>24}{'epochs (selected)':>26}"
            f"{'s per run':>22}")
    print(head + "\n" + "-" * len(head), flush=True)
    for name, data in datasets.items():
        for model in models:
            m, wall = run(data, task, model, seeds, tmp)
            s = m["summary"][key]
            per_seed = " ".join(f"{r['test'][key]:.4f}" for r in m["runs"])
            epochs = " ".join(f"{len(r['epochs'])}({r['selected_epoch']})" for r in m["runs"])
            pub = PUBLISHED.get((name, model))
            per_run = f"{wall / len(m['runs']):.0f} (all {wall:.0f})"
            print(f"{name:<13}{model:<7}{s['mean']:>10.4f} ± {s['std']:.4f}{pub or '-':>11}{per_seed:>24}{epochs:>26}"
                  f"{per_run:>22}", flush=True)


def parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs.py checks the documented commands against it)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("link", "node", "dynamic-node"), default=None,
                   help="one table: link prediction, static node classification, or dynamic node classification")
    p.add_argument("--datasets", default=None, help="comma-separated (default: all of the task's)")
    p.add_argument("--models", default=None, help="comma-separated (default: all of the task's)")
    p.add_argument("--seeds", default="0,1,2")
    return p


def main() -> None:
    a = parser().parse_args()
    with tempfile.TemporaryDirectory(prefix="accuracy-") as tmp:
        for name, task, key, datasets, models in (("link", "link", "ap", LINK, LINK_MODELS),
                                                  ("node", "node", "acc", NODE, NODE_MODELS),
                                                  ("dynamic-node", "node", "auc", DYNAMIC_NODE, LINK_MODELS)):
            if a.only not in (None, name):
                continue
            if a.datasets:
                datasets = {k: v for k, v in datasets.items() if k in a.datasets.split(",")}
            table(task, key, datasets, a.models.split(",") if a.models else list(models), a.seeds, Path(tmp))


if __name__ == "__main__":
    main()
