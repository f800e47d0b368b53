"""Where DyRep's published UCI number (DyGLib's 0.651 test AP) comes from: DyRep as DyGLib
formulates, trains and evaluates it, re-implemented here from a reading of its source
(models/MemoryModel.py, train_link_prediction.py, evaluate_models_utils.py,
utils/DataLoader.py), beside gnndist's DyRep at the same configuration, on the same UCI events.

The peer: memory 172 (DyGLib pads UCI's missing features to 172 zeros), time encoding 100,
messages [own memory, other endpoint's graph-attention embedding, encoded time since the last
update, edge features] folded by an RNN cell, the attention's inputs and the stored messages
detached (so the attention and time encoder get no gradient), the updated memory as the
embedding, an MLP link predictor; Adam at 1e-4, batches of 200 events, one random negative per
event, early stopping on validation AP and AUC (both must improve) with patience 20. Split:
chronological 70/15/15 by time quantiles, with 10% of the nodes held out of training; test AP
is the mean over batches of each batch's AP, over the memory as it stood after the selected
epoch's validation. gnndist: `train_link` with `memory_dim=172, lr=1e-4, patience=20`, its own
split and protocol (test AP over all test events, memory rebuilt by replaying training and
validation through the selected model).

    python benchmarks/dyrep_dyglib.py [--seeds 0,1,2] [--epochs 100] [--only peer|gnndist]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from gnndist.datasets import load
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.time_encoding import time_encoder
from gnndist.temporal.fit import train_link

UCI = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "uci_collegemsg" / "CollegeMsg.txt.gz"
MEMORY, TIME, FEATURES, NEIGHBOURS, HEADS, BATCH, PATIENCE, LR = 172, 100, 172, 10, 2, 200, 20, 1e-4
PEER = "peer (DyGLib's DyRep)"


class Events:
    """UCI as DyGLib reads it: node ids from 1 (0 pads), times from the first event, and its
    split (time quantiles 0.70 and 0.85; 10% of the nodes seen after training held out of it)."""

    def __init__(self, path: Path, seed: int) -> None:
        tg = load(str(path))
        self.src, self.dst = tg.src.astype(np.int64) + 1, tg.dst.astype(np.int64) + 1
        self.t = tg.t - tg.t[0]
        self.num_nodes = tg.num_nodes + 1
        val_time, test_time = np.quantile(self.t, [0.70, 0.85])
        later = np.unique(np.r_[self.src[self.t > val_time], self.dst[self.t > val_time]])
        held = np.random.default_rng(seed).choice(later, int(0.1 * tg.num_nodes), replace=False)
        touches_held = np.isin(self.src, held) | np.isin(self.dst, held)
        self.train = (self.t <= val_time) & ~touches_held
        self.val = (self.t > val_time) & (self.t <= test_time)
        self.test = self.t > test_time


class RecentNeighbours:
    """The K most recent events of a node strictly before a time, among the events in `mask`."""

    def __init__(self, ev: Events, mask: np.ndarray) -> None:
        node = np.r_[ev.src[mask], ev.dst[mask]]
        other, t = np.r_[ev.dst[mask], ev.src[mask]], np.r_[ev.t[mask], ev.t[mask]]
        order = np.lexsort((t, node))
        self.node, self.other, self.t = node[order], other[order], t[order]
        self.span = ev.t.max() + 2  # integer seconds: (node, time) as one sortable key
        self.key = self.node * self.span + self.t

    def __call__(self, nodes: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        end = np.searchsorted(self.key, nodes * self.span + times, side="left")
        start = np.searchsorted(self.node, nodes, side="left")
        idx = end[:, None] - NEIGHBOURS + np.arange(NEIGHBOURS)
        valid = idx >= start[:, None]
        idx = np.where(valid, idx, 0)
        return np.where(valid, self.other[idx], 0), np.where(valid, self.t[idx], 0.0), valid


class Merge(nn.Module):
    """fc2(relu(fc1([a, b])))."""

    def __init__(self, dim_a: int, dim_b: int, hidden: int, out: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim_a + dim_b, hidden), nn.Linear(hidden, out)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(torch.cat([a, b], 1))))


class Attention(nn.Module):
    """One layer of multi-head attention of [memory, time(0)] over the neighbours' [memory, edge
    features, time since], with a residual and layer norm, then merged with the node's memory."""

    def __init__(self) -> None:
        super().__init__()
        q_dim, k_dim = MEMORY + TIME, MEMORY + FEATURES + TIME
        self.head_dim = q_dim // HEADS
        self.q = nn.Linear(q_dim, HEADS * self.head_dim, bias=False)
        self.k = nn.Linear(k_dim, HEADS * self.head_dim, bias=False)
        self.v = nn.Linear(k_dim, HEADS * self.head_dim, bias=False)
        self.fc, self.norm = nn.Linear(HEADS * self.head_dim, q_dim), nn.LayerNorm(q_dim)
        self.merge = Merge(q_dim, MEMORY, MEMORY, MEMORY)

    def forward(self, memory, time_zero, nbr_memory, nbr_time, valid):
        r = memory.shape[0]
        query = torch.cat([memory, time_zero], 1)
        keys = torch.cat([nbr_memory, torch.zeros(r, NEIGHBOURS, FEATURES), nbr_time], 2)
        q = self.q(query).view(r, HEADS, 1, self.head_dim)
        k = self.k(keys).view(r, NEIGHBOURS, HEADS, self.head_dim).transpose(1, 2)
        v = self.v(keys).view(r, NEIGHBOURS, HEADS, self.head_dim).transpose(1, 2)
        score = (q @ k.transpose(2, 3)) * self.head_dim ** -0.5
        attn = score.masked_fill(~valid[:, None, None, :], -1e10).softmax(-1)
        out = self.norm(self.fc((attn @ v).reshape(r, -1)) + query)
        return self.merge(out, memory)


class PeerDyRep(nn.Module):
    """DyGLib's DyRep: a memory bank with each node's last pending message."""

    def __init__(self, num_nodes: int) -> None:
        super().__init__()
        self.num_nodes = num_nodes
        self.time = time_encoder(TIME)
        self.cell = nn.RNNCell(2 * MEMORY + TIME + FEATURES, MEMORY)
        self.attention = Attention()
        self.predictor = Merge(MEMORY, MEMORY, MEMORY, 1)
        self.reset()

    def reset(self) -> None:
        n = self.num_nodes
        self.memory, self.last = torch.zeros(n, MEMORY), torch.zeros(n)
        self.message, self.message_t = torch.zeros(n, self.cell.input_size), torch.zeros(n)
        self.pending = torch.zeros(n, dtype=torch.bool)

    def snapshot(self) -> tuple:
        return tuple(x.clone() for x in (self.memory, self.last, self.message, self.message_t, self.pending))

    def restore(self, snap: tuple) -> None:
        self.memory, self.last, self.message, self.message_t, self.pending = (x.clone() for x in snap)

    def updated(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every node's memory and update time after its pending message (grad into the cell)."""
        rows = torch.nonzero(self.pending).squeeze(1)
        memory = self.memory.index_copy(0, rows, self.cell(self.message[rows], self.memory[rows]))
        return memory, self.last.index_copy(0, rows, self.message_t[rows])

    def step(self, src, dst, t, neg, neighbours: RecentNeighbours) -> torch.Tensor:
        """Logits [2B] of (src, dst) then (src, neg); the events' messages are stored after."""
        memory, last = self.updated()
        s, d, n = (torch.from_numpy(x) for x in (src, dst, neg))
        logits = torch.cat([self.predictor(memory[s], memory[d]), self.predictor(memory[s], memory[n])]).squeeze(1)
        with torch.no_grad():  # stored messages are detached before any batch consumes them
            fixed = memory.detach()
            ends, times = np.r_[src, dst], np.r_[t, t]
            nbr, nbr_t, valid = neighbours(ends, times)
            r = len(ends)
            embed = self.attention(fixed[torch.from_numpy(ends)], self.time(torch.zeros(r, 1)).squeeze(1),
                                   fixed[torch.from_numpy(nbr.reshape(-1))].view(r, NEIGHBOURS, MEMORY),
                                   self.time(torch.from_numpy(times[:, None] - nbr_t).float()),
                                   torch.from_numpy(valid))
            touched = torch.from_numpy(np.unique(ends))
            self.memory[touched], self.last[touched] = fixed[touched], last[touched]
            self.pending[touched] = False
            b = len(src)
            for own, other_embed in ((src, embed[b:]), (dst, embed[:b])):
                o = torch.from_numpy(own)
                dt = torch.from_numpy(t).float() - self.last[o]
                message = torch.cat([self.memory[o], other_embed, self.time(dt.unsqueeze(1)).squeeze(1),
                                     torch.zeros(b, FEATURES)], 1)
                nodes, last_rev = np.unique(own[::-1], return_index=True)  # a node keeps its last message
                keep = torch.from_numpy(b - 1 - last_rev)
                rows = torch.from_numpy(nodes)
                self.message[rows], self.message_t[rows] = message[keep], torch.from_numpy(t).float()[keep]
                self.pending[rows] = True
        return logits


def batch_ap_auc(pos: np.ndarray, neg: np.ndarray) -> tuple[float, float]:
    scores, labels = np.r_[pos, neg], np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    order = np.argsort(-scores, kind="stable")
    hits = labels[order]
    ap = float((np.cumsum(hits) / np.arange(1, len(hits) + 1) * hits).sum() / hits.sum())
    ranks = np.empty(len(scores))
    ranks[np.argsort(scores, kind="stable")] = np.arange(1, len(scores) + 1)
    auc = float((ranks[labels == 1].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))
    return ap, auc


def peer(ev: Events, seed: int, epochs: int) -> dict:
    """DyGLib's training loop and early stopping; the selected epoch's test over its post-validation memory."""
    torch.manual_seed(seed)
    model = PeerDyRep(ev.num_nodes)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    train_nbrs, all_nbrs = RecentNeighbours(ev, ev.train), RecentNeighbours(ev, np.ones(len(ev.t), bool))
    train_dst, all_dst = np.unique(ev.dst[ev.train]), np.unique(ev.dst)

    def run(mask, neighbours, candidates, rng, learn):
        idx = np.nonzero(mask)[0]
        metrics = []
        for start in range(0, len(idx), BATCH):
            i = idx[start:start + BATCH]
            neg = candidates[rng.integers(0, len(candidates), len(i))]
            with torch.set_grad_enabled(learn):
                logits = model.step(ev.src[i], ev.dst[i], ev.t[i], neg, neighbours)
            if learn:
                labels = torch.cat([torch.ones(len(i)), torch.zeros(len(i))])
                loss = nn.functional.binary_cross_entropy(logits.sigmoid(), labels)
                opt.zero_grad()
                loss.backward()
                opt.step()
            p = logits.detach().sigmoid().numpy()
            metrics.append(batch_ap_auc(p[:len(i)], p[len(i):]))
        return np.mean(metrics, axis=0)

    best, waited, curve = None, 0, []
    for epoch in range(1, epochs + 1):
        model.reset()
        model.train()
        run(ev.train, train_nbrs, train_dst, np.random.default_rng([seed, epoch]), True)
        model.eval()
        val_ap, val_auc = run(ev.val, all_nbrs, all_dst, np.random.default_rng(0), False)
        after_val = model.snapshot()
        test_ap, _ = run(ev.test, all_nbrs, all_dst, np.random.default_rng(2), False)
        model.restore(after_val)
        curve.append((round(float(val_ap), 4), round(float(test_ap), 4)))
        if best is None or (val_ap > best[1] and val_auc > best[2]):
            best, waited = (epoch, val_ap, val_auc, test_ap), 0
        else:
            waited += 1
            if waited >= PATIENCE:
                break
    return {"epochs": len(curve), "selected_epoch": best[0], "val_ap": float(best[1]), "test_ap": float(best[3]),
            "curve": curve}


def ours(seed: int, epochs: int) -> dict:
    m = train_link(str(UCI), LinkConfig(model="dyrep", memory_dim=MEMORY, lr=LR, patience=PATIENCE, epochs=epochs,
                                        seed=seed, quiet=True))
    return {"epochs": len(m["epochs"]), "selected_epoch": m["selected_epoch"], "val_ap": m["epochs"][m["selected_epoch"] - 1]["val_ap"],
            "test_ap": m["test"]["ap"]}


def parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs.py checks the documented commands against it)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--only", choices=("peer", "gnndist"), help="run one side only")
    return p


def main() -> None:
    args = parser().parse_args()
    rows = {PEER: [], "gnndist": []}
    for seed in (int(s) for s in args.seeds.split(",")):
        for name, fn in ((PEER, lambda: peer(Events(UCI, seed), seed, args.epochs)),
                         ("gnndist", lambda: ours(seed, args.epochs))):
            if args.only and not name.startswith(args.only):
                continue
            t0 = time.time()
            r = fn()
            rows[name].append(r["test_ap"])
            print(f"seed {seed} {name}: test AP {r['test_ap']:.4f}, val AP {r['val_ap']:.4f}, epoch "
                  f"{r['selected_epoch']} of {r['epochs']}, {time.time() - t0:.0f} s"
                  + (f"; (val, test) per epoch {r['curve']}" if "curve" in r else ""), flush=True)
    means = {}
    for name, v in ((n, np.array(v)) for n, v in rows.items() if v):
        means[name] = v.mean()
        print(f"test AP of {name} over {len(v)} seeds: {v.mean():.4f} ± {v.std(ddof=1) if len(v) > 1 else 0:.4f}")
    if len(means) == 2:
        print(f"gnndist / peer {means['gnndist'] / means[PEER]:.3f} (published: 0.651)")


if __name__ == "__main__":
    main()
