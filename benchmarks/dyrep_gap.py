"""Why DyRep falls short on UCI: its embedding is the node memory itself, which changes only at
the node's own events, so its score cannot tell how long ago a node was last active; JODIE's
time projection can. Trains each model for a few epochs (seed 0, defaults otherwise), then
scores the validation and test events with the memory carried on, and prints per split: AP, the
AP of the recency heuristic alone (a candidate destination scores -log(1 + time since its last
event)), the correlation of the model's scores with that staleness, and AP over consecutive
tenths of the validation + test events.

    python benchmarks/dyrep_gap.py [--models dyrep,jodie] [--epochs 3]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from gnndist.datasets import load
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.events import RankEvents
from gnndist.temporal.linkpred import EvalNegatives, link_metrics
from gnndist.temporal.trainer import LinkTrainer

UCI = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "uci_collegemsg" / "CollegeMsg.txt.gz"


def ap(pos: np.ndarray, neg: np.ndarray) -> float:
    return link_metrics(pos, neg[:, None])["ap"]


def scored(trainer: LinkTrainer) -> np.ndarray:
    """[P, 4] per validation and test event: its score, its first negative's score, and the
    time since the last event of its destination and of that negative (memory carried on)."""
    ev, cfg = trainer.events, trainer.cfg
    negs = EvalNegatives(ev.new_to_orig[ev.src[ev.scored]], ev.new_to_orig[ev.dst[ev.scored]], ev.eid[ev.scored],
                         ev.num_nodes, trainer.train_end, ev.num_events, cfg.neg, 1, cfg.seed,
                         trainer.candidates.eval)
    state = trainer.state.state

    def staleness(ids: torch.Tensor, t: torch.Tensor) -> np.ndarray:
        _, last_update, _, mail_time = state.read(ids)
        return (t - torch.maximum(last_update, mail_time[:, -1])).numpy()

    rows = []
    trainer.model.eval()
    with torch.no_grad():
        for index, s, e in trainer.batches(trainer.train_end, ev.num_events):
            b = trainer.batch(s, e, lambda r, src, dst: negs.batch(index, e - s, r, src, dst))
            stale = staleness(b.dst, b.t), staleness(b.neg[:, 0], b.t)
            fw = trainer.forward(b)
            trainer.model.write(trainer.state, b, fw)
            rows.append(np.stack([fw.pos.numpy(), fw.neg[:, 0].numpy(), *stale], 1))
    return np.concatenate(rows)


def parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs.py checks the documented commands against it)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="dyrep,jodie")
    p.add_argument("--epochs", type=int, default=3)
    return p


def main() -> None:
    args = parser().parse_args()
    tg = load(str(UCI))
    for model in args.models.split(","):
        trainer = LinkTrainer(RankEvents.from_graph(tg), LinkConfig(model=model, seed=0, quiet=True))
        for epoch in range(1, args.epochs + 1):
            trainer.train_epoch(epoch)
        r = scored(trainer)
        n_val = trainer.val_end - trainer.train_end
        for name, x in (("val", r[:n_val]), ("test", r[n_val:])):
            recency = ap(-np.log1p(x[:, 2]), -np.log1p(x[:, 3]))
            corr = np.corrcoef(np.r_[x[:, 0], x[:, 1]], np.log1p(np.r_[x[:, 2], x[:, 3]]))[0, 1]
            print(f"{model} {name}: AP {ap(x[:, 0], x[:, 1]):.3f}, recency alone {recency:.3f}, "
                  f"corr(score, log staleness) {corr:+.3f}, median staleness of destinations "
                  f"{np.median(x[:, 2]):,.0f} s, of negatives {np.median(x[:, 3]):,.0f} s")
        tenths = np.array_split(r, 10)
        print(f"{model} AP per tenth of val + test: " + " ".join(f"{ap(x[:, 0], x[:, 1]):.3f}" for x in tenths))


if __name__ == "__main__":
    main()
