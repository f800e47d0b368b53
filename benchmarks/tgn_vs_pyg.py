"""gnndist's TGN against PyG's own TGN components, same configuration, same run.

Both train one epoch on the first 70% of the events (memory 100, time encoding 100, 10 most
recent neighbours, batch 200, Adam at the same learning rate), then score the validation and
test events while their memory keeps absorbing the true events. Test AP is computed the same
way for both, over the whole test period against the same fixed random negatives (one per
positive). PyG's side follows its examples/tgn.py: TGNMemory (IdentityMessage,
LastAggregator) + LastNeighborLoader + TransformerConv, with TemporalDataLoader negatives.

    python benchmarks/tgn_vs_pyg.py [--data FILE] [--events N] [--threads T] [--lr LR] [--busy N]
                                    [--device cuda]

Prints training events/s (wall clock and CPU time) and test AP of each, and the ratios (with
`--device cuda`, both on the GPU, and each one's peak of allocated GPU memory). gnndist's
trainer compiles (first run on a machine) or loads its numba kernels when it is built, before
its epoch is timed. With `--busy N` both run twice: alone, then beside N CPU-bound processes (another
job on a shared machine), and each one's events/s beside them is printed as a ratio to its
events/s alone.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from gnndist.datasets import chronological_split, load
from gnndist.temporal.events import RankEvents
from gnndist.temporal.linkpred import EvalNegatives, average_precision, negative_candidates
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.fit import train_link

DEFAULTS = LinkConfig()
TIME_DIM, NUM_NEIGHBORS, EVAL_NEGATIVES = DEFAULTS.time_dim, DEFAULTS.num_neighbors, DEFAULTS.eval_negatives

UCI = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "uci_collegemsg" / "CollegeMsg.txt.gz"
MEMORY = 100


def gnndist_side(tg, lr: float, seed: int, device: str) -> dict:
    """One epoch of `gnndist train --task link --model tgn`, through the trainer itself."""
    cfg = LinkConfig(model="tgn", epochs=1, batch_size=200, lr=lr, memory_dim=MEMORY, seed=seed, quiet=True,
                     device=device)
    ep = (m := train_link(tg, cfg))["epochs"][0]
    return {"events_per_s": ep["events_per_s"], "train_s": ep["time_s"], "cpu_s": ep["cpu_s"], "test_ap": m["test"]["ap"]}


def pyg_side(tg, lr: float, seed: int, device: str) -> dict:
    """PyG's examples/tgn.py on the same events, timed the same way (training epoch only)."""
    from torch_geometric.data import TemporalData
    from torch_geometric.loader import TemporalDataLoader
    from torch_geometric.nn import TransformerConv
    from torch_geometric.nn.models.tgn import IdentityMessage, LastAggregator, LastNeighborLoader, TGNMemory

    class GraphAttentionEmbedding(torch.nn.Module):
        def __init__(self, in_channels, out_channels, msg_dim, time_enc):
            super().__init__()
            self.time_enc = time_enc
            self.conv = TransformerConv(in_channels, out_channels // 2, heads=2, dropout=0.1,
                                        edge_dim=msg_dim + time_enc.out_channels)

        def forward(self, x, last_update, edge_index, t, msg):
            rel_t = last_update[edge_index[0]] - t
            edge_attr = torch.cat([self.time_enc(rel_t.to(x.dtype)), msg], dim=-1)
            return self.conv(x, edge_index, edge_attr)

    class LinkPredictor(torch.nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.lin_src, self.lin_dst = torch.nn.Linear(dim, dim), torch.nn.Linear(dim, dim)
            self.lin_final = torch.nn.Linear(dim, 1)

        def forward(self, z_src, z_dst):
            return self.lin_final((self.lin_src(z_src) + self.lin_dst(z_dst)).relu())

    torch.manual_seed(seed)
    train_end, val_end = chronological_split(tg)
    # PyG's TGNMemory cannot hold 0-wide messages: a featureless graph gets one zero column
    msg = torch.from_numpy(tg.edge_feat) if tg.edge_feat is not None else torch.zeros(tg.num_events, 1)
    data = TemporalData(src=torch.from_numpy(tg.src), dst=torch.from_numpy(tg.dst),
                        t=torch.from_numpy(tg.t.astype(np.int64)), msg=msg).to(device)
    memory = TGNMemory(tg.num_nodes, msg.shape[1], MEMORY, TIME_DIM,
                       message_module=IdentityMessage(msg.shape[1], MEMORY, TIME_DIM),
                       aggregator_module=LastAggregator()).to(device)
    gnn = GraphAttentionEmbedding(MEMORY, MEMORY, msg.shape[1], memory.time_enc).to(device)
    link_pred = LinkPredictor(MEMORY).to(device)
    params = set(memory.parameters()) | set(gnn.parameters()) | set(link_pred.parameters())
    optimizer = torch.optim.Adam(params, lr=lr)
    criterion = torch.nn.BCEWithLogitsLoss()
    loader = LastNeighborLoader(tg.num_nodes, size=NUM_NEIGHBORS, device=device)
    assoc = torch.empty(tg.num_nodes, dtype=torch.long, device=device)

    def embed(src, dst, neg, t_batch):
        n_id = torch.cat([src, dst, neg]).unique()
        n_id, edge_index, e_id = loader(n_id)
        assoc[n_id] = torch.arange(n_id.size(0), device=device)
        z, last_update = memory(n_id)
        z = gnn(z, last_update, edge_index, data.t[e_id], data.msg[e_id])
        return (link_pred(z[assoc[src]], z[assoc[dst]]), link_pred(z[assoc[src]], z[assoc[neg]]))

    memory.train(), gnn.train(), link_pred.train()
    memory.reset_state(), loader.reset_state()
    t0, c0 = time.perf_counter(), time.process_time()
    for batch in TemporalDataLoader(data[:train_end], batch_size=200, neg_sampling_ratio=1.0):
        optimizer.zero_grad()
        pos_out, neg_out = embed(batch.src, batch.dst, batch.neg_dst, batch.t)
        loss = criterion(pos_out, torch.ones_like(pos_out)) + criterion(neg_out, torch.zeros_like(neg_out))
        memory.update_state(batch.src, batch.dst, batch.t, batch.msg)
        loader.insert(batch.src, batch.dst)
        loss.backward()
        optimizer.step()
        memory.detach()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - c0

    memory.eval(), gnn.eval(), link_pred.eval()
    # the test negatives gnndist draws (per global batch of 200 events, as its evaluation does)
    among = negative_candidates(RankEvents.from_graph(tg), train_end).eval
    test_neg = EvalNegatives(tg.src, tg.dst, np.arange(tg.num_events), tg.num_nodes, val_end, tg.num_events,
                             "random", EVAL_NEGATIVES, seed, among)
    pos_all, neg_all = [], []
    with torch.no_grad():
        for s in [*range(train_end, val_end, 200), *range(val_end, tg.num_events, 200)]:
            e = min(s + 200, val_end if s < val_end else tg.num_events)
            b = data[s:e]
            rows = np.arange(e - s)
            neg = torch.randint(0, tg.num_nodes, (e - s,)) if s < val_end else torch.from_numpy(
                test_neg.batch((s - val_end) // 200, e - s, rows, tg.src[s:e], tg.dst[s:e])[:, 0])
            pos_out, neg_out = embed(b.src, b.dst, neg.to(device), b.t)
            if s >= val_end:
                pos_all.append(pos_out.view(-1).cpu().numpy())
                neg_all.append(neg_out.view(-1).cpu().numpy())
            memory.update_state(b.src, b.dst, b.t, b.msg)
            loader.insert(b.src, b.dst)
    return {"events_per_s": train_end / seconds, "train_s": seconds, "cpu_s": cpu,
            "test_ap": average_precision(np.concatenate(pos_all), np.concatenate(neg_all))}


@contextlib.contextmanager
def busy(n: int):
    """`n` CPU-bound processes (a pure Python loop each) running until the block ends or this
    process does. Each starts a session of its own, as another user's job would: where the
    kernel shares the CPU between sessions (autogroup scheduling) it competes as another job,
    not as one more thread of ours."""
    loop = f"import os\nwhile os.getppid() == {os.getpid()}:\n    for _ in range(10**6): pass"  # ends with us
    procs = [subprocess.Popen([sys.executable, "-c", loop], start_new_session=True) for _ in range(n)]
    try:
        yield
    finally:
        for q in procs:
            q.kill()
            q.wait()


def on_gpu_peak(side, tg, lr: float, seed: int, device: str) -> dict:
    """`side`'s metrics, with its peak of allocated GPU memory on `--device cuda`."""
    if device != "cuda":
        return side(tg, lr, seed, device)
    torch.cuda.reset_peak_memory_stats()
    return {**side(tg, lr, seed, device), "peak_gpu_bytes": torch.cuda.max_memory_allocated()}


def compare(tg, args: argparse.Namespace, n_busy: int) -> tuple[dict, dict]:
    """Both sides on `tg`, beside `n_busy` busy processes; prints their table."""
    with busy(n_busy):
        ours = on_gpu_peak(gnndist_side, tg, args.lr, args.seed, args.device)
        theirs = on_gpu_peak(pyg_side, tg, args.lr, args.seed, args.device)
    gpu = args.device == "cuda"
    print(f"{f'--busy {n_busy}':<10}{'events/s':>10}{'train s':>9}{'CPU s':>8}{'test AP':>9}"
          + (f"{'GPU MiB':>9}" if gpu else ""))
    for name, r in (("gnndist", ours), ("PyG", theirs)):
        print(f"{name:<10}{r['events_per_s']:>10,.0f}{r['train_s']:>9.1f}{r['cpu_s']:>8.1f}{r['test_ap']:>9.4f}"
              + (f"{r['peak_gpu_bytes'] / 2**20:>9,.0f}" if gpu else ""))
    print(f"speed-up {ours['events_per_s'] / theirs['events_per_s']:.2f}x (wall clock), "
          f"AP difference {ours['test_ap'] - theirs['test_ap']:+.4f}; load {open('/proc/loadavg').read().split()[0]}")
    return ours, theirs


def parser() -> argparse.ArgumentParser:
    """The command line (tests/test_docs.py checks the documented commands against it)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(UCI), help="temporal graph file (default: UCI CollegeMsg)")
    p.add_argument("--events", type=int, default=None, help="use only the first N events (a scaled-down run)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--lr", type=float, default=DEFAULTS.lr, help="learning rate of both")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where both train and score")
    p.add_argument("--busy", type=int, default=0, metavar="N",
                   help="also run both beside N CPU-bound processes and print the slow-down ratios")
    return p


def main() -> None:
    args = parser().parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tg = load(args.data)
    if args.events:
        tg = tg.slice(0, min(args.events, tg.num_events))
    print(f"{args.data}: {tg.num_events} events, {tg.num_nodes} nodes; torch threads {torch.get_num_threads()}, "
          f"{os.cpu_count()} cores, OMP_WAIT_POLICY as gnndist left it: {os.environ.get('OMP_WAIT_POLICY')}, "
          f"lr {args.lr}; one training epoch each on {args.device}; load {open('/proc/loadavg').read().split()[0]}")
    alone = compare(tg, args, 0)
    if args.busy:
        beside = compare(tg, args, args.busy)
        for name, a, b in zip(("gnndist", "PyG"), alone, beside):
            print(f"{name}: events/s with --busy {args.busy} / alone = {b['events_per_s']:,.0f} / "
                  f"{a['events_per_s']:,.0f} = {b['events_per_s'] / a['events_per_s']:.2f}x")


if __name__ == "__main__":
    main()
