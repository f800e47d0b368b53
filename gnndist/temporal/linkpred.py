"""Link-prediction negatives and metrics (AP, ROC-AUC, MRR), ties counted fairly, on one rank or
over the scores of all ranks.

Negatives are drawn per global batch, from random streams keyed by (seed, period or epoch,
batch index), in original node ids: any rank draws the rows of its own events of the batch and
gets what one process would draw. Strategies follow Poursafaei et al. 2022, with the source of
each positive kept so that every positive has its own list of negative destinations (needed for
MRR): `random` (any candidate), `historical` (a destination the source reached before the
evaluated period), `inductive` (a destination the source reaches in the evaluated period but
never before it). A source without such candidates falls back to random ones. A negative never
equals its positive's destination. Candidates of a source come from its own events, which the
rank that owns the source holds.

Random candidates (`Candidates`): any node; on a bipartite graph (no node is both a source and
a destination, as JODIE's users and items) the destinations only, as TGN, TGL and DyGLib draw
them: those of the training events for training, those of all events for evaluation
(TGN's `RandEdgeSampler`, DyGLib's `NegativeEdgeSampler`). A user is never a destination there,
and a negative drawn among users would be easy to tell from the positive item.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import torch

from gnndist.runtime import dist
from gnndist.errors import GnndistError
from gnndist.graph import indptr_of, unique_ints
from gnndist.samplers import sampler_group
from gnndist.temporal.config import NEG_STRATEGIES
from gnndist.temporal.events import RankEvents


class Candidates(NamedTuple):
    """Where random negatives come from (original ids): `kind` "all" (any node; `train` and
    `eval` None) or "destinations" (sorted: the training events' destinations, all events')."""

    kind: str = "all"
    train: Optional[np.ndarray] = None
    eval: Optional[np.ndarray] = None


def negative_candidates(ev: RankEvents, train_end: int) -> Candidates:
    """The random negatives' candidates of the graph whose events `ev` holds this rank's part of:
    its destinations where no node is both a source and a destination, else every node (a
    collective: each rank tells of the nodes it owns, whose events it holds)."""
    lo, n = ev.lo, ev.hi - ev.lo
    as_src, as_dst, train_dst = (np.zeros(n, bool) for _ in range(3))
    own_src, own_dst = ev.owns(ev.src), ev.owns(ev.dst)
    as_src[ev.src[own_src] - lo] = True
    as_dst[ev.dst[own_dst] - lo] = True
    train_dst[ev.dst[own_dst & (ev.eid < train_end)] - lo] = True
    group = sampler_group()
    both = dist.all_reduce(torch.tensor([int(np.count_nonzero(as_src & as_dst))]), group=group)
    if int(both[0]) or ev.num_events == 0:
        return Candidates()

    def gathered(mine: np.ndarray) -> np.ndarray:
        ids = torch.from_numpy(ev.new_to_orig[lo + np.flatnonzero(mine)])
        return np.sort(torch.cat(dist.all_gather_varsize(ids, group)).numpy())

    return Candidates("destinations", gathered(train_dst), gathered(as_dst))


def train_negatives(seed: int, epoch: int, batch_index: int, batch_size: int, rows: np.ndarray, dst: np.ndarray,
                    num_nodes: int, among: Optional[np.ndarray] = None) -> np.ndarray:
    """One random negative destination [len(rows), 1] (original ids) for the events at positions
    `rows` (with original destinations `dst`) of global training batch `batch_index` of
    `batch_size` events, seeded by (seed, epoch, batch index) only; drawn among the sorted ids
    `among` (None: all `num_nodes` nodes)."""
    rng = np.random.default_rng([seed, epoch, batch_index, 0x7E57])
    return _other(rng.integers(1, _size(num_nodes, among), size=(batch_size, 1))[rows], dst, num_nodes, among)


def _size(num_nodes: int, among: Optional[np.ndarray]) -> int:
    """How many candidates there are (at least 2: the draws' upper bound)."""
    m = num_nodes if among is None else among.size
    if m < 2:
        raise GnndistError("negative sampling needs at least 2 nodes" if among is None else
                           "negative sampling needs at least 2 destinations on a bipartite graph")
    return m


def _other(off: np.ndarray, dst: np.ndarray, num_nodes: int, among: Optional[np.ndarray] = None) -> np.ndarray:
    """Node ids `dst + off` (offsets in [1, N)), which never equal their row's `dst`; with
    `among` (sorted candidates), the candidate `off` places after `dst`'s place among them (a
    `dst` that is none of them: after the place it would take)."""
    m = _size(num_nodes, among)
    dst = np.asarray(dst, np.int64)
    if among is None:
        return (dst[:, None] + off) % m
    at = np.searchsorted(among, dst)
    missing = at >= m
    missing[~missing] = among[at[~missing]] != dst[~missing]
    return among[(at[:, None] + off - missing[:, None]) % m]


class EvalNegatives:
    """Fixed negatives [B, n] for the events of a validation or test period [start, stop), drawn
    per global batch. `src`, `dst`, `eid` are the (original-id) events whose sources this rank
    owns; candidates of `historical` come from those before `start`, of `inductive` from the pairs
    in the period that never occur before it."""

    def __init__(self, src: np.ndarray, dst: np.ndarray, eid: np.ndarray, num_nodes: int, start: int, stop: int,
                 strategy: str = "random", n: int = 1, seed: int = 0, among: Optional[np.ndarray] = None) -> None:
        if strategy not in NEG_STRATEGIES:
            raise GnndistError(f"unknown negative sampling {strategy!r}; choose one of {', '.join(NEG_STRATEGIES)}")
        self.num_nodes, self.start, self.strategy, self.n, self.seed = num_nodes, start, strategy, n, seed
        self.among = among  # random candidates (sorted original ids), or None: all nodes
        self.sources = np.zeros(0, np.int64)
        if strategy == "random":
            return
        n_ = num_nodes
        before = eid < start
        if strategy == "historical":
            key = unique_ints(src[before] * n_ + dst[before])
        else:
            seen = unique_ints(src[before] * n_ + dst[before])
            period = (eid >= start) & (eid < stop)
            key = unique_ints(src[period] * n_ + dst[period])
            key = key[~np.isin(key, seen)]
        s = key // n_
        self.sources = unique_ints(s)  # sources with candidates; their candidate lists, sorted
        self.indptr, self.cand = indptr_of(np.searchsorted(self.sources, s), self.sources.size), key % n_

    def batch(self, index: int, batch_size: int, rows: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Negatives (original ids) of the events at positions `rows`, with original endpoints
        `src`, `dst`, of the period's batch `index` of `batch_size` events."""
        rng = np.random.default_rng([self.seed, self.start, index, NEG_STRATEGIES.index(self.strategy)])
        off = rng.integers(1, _size(self.num_nodes, self.among), size=(batch_size, self.n))[rows]
        out = _other(off, dst, self.num_nodes, self.among)
        if self.strategy == "random":
            return out
        u = rng.random((batch_size, self.n))[rows]
        if self.sources.size == 0:
            return out
        at = np.searchsorted(self.sources, src)
        has = at < self.sources.size
        has[has] = self.sources[at[has]] == src[has]
        at = np.where(has, at, 0)
        lo = self.indptr[at]
        count = np.where(has, self.indptr[at + 1] - lo, 0)
        idx = lo[:, None] + (u * count[:, None]).astype(np.int64)
        pick = self.cand[np.minimum(idx, self.cand.size - 1)] if self.cand.size else out
        use = (count[:, None] > 0) & (pick != dst[:, None])
        return np.where(use, pick, out)


# ---------------------------------------------------------------------------------------- metrics

def _by_value(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Every rank's (score, label) pairs redistributed so that rank r holds the r-th value range
    (ascending; equal scores on one rank); returns this rank's pairs and its range index."""
    w, me = dist.world_size(), dist.rank()
    local = np.sort(scores)
    sample = local[np.linspace(0, local.size - 1, min(local.size, 256)).astype(np.int64)] if local.size else local
    group = sampler_group()  # host-side: the gloo group, whatever the trainers' backend
    merged = np.sort(torch.cat(dist.all_gather_varsize(torch.from_numpy(sample), group)).numpy())
    cuts = merged[(np.arange(1, w) * merged.size) // w] if merged.size else np.full(w - 1, np.inf)
    bucket = np.searchsorted(cuts, scores, side="right")
    order = np.argsort(bucket, kind="stable")
    pairs = torch.from_numpy(np.stack([scores, labels], 1)[order])
    got = dist.joined(dist.exchange(pairs.split(np.bincount(bucket, minlength=w).tolist()), group)).numpy()
    return got[:, 0], got[:, 1], me


def ranking_metrics(pos: np.ndarray, neg: np.ndarray, across_ranks: bool = False) -> tuple[float, float]:
    """(AP, ROC-AUC) of the positive scores `pos` against the negative scores `neg` (1-d), over
    the scores of all ranks when `across_ranks` (a collective; no rank gathers them all). AP is
    the area under the precision-recall step curve with tied scores as one threshold; AUC is
    P(pos > neg) + P(pos = neg) / 2. NaN without positives (AUC: or without negatives)."""
    scores = np.concatenate([pos, neg]).astype(np.float64)
    labels = np.concatenate([np.ones(len(pos)), np.zeros(len(neg))])
    spread = across_ranks and dist.world_size() > 1
    if spread:
        scores, labels, me = _by_value(scores, labels)
    order = np.argsort(-scores, kind="stable")
    s, lab = scores[order], labels[order]
    last = np.r_[np.flatnonzero(np.diff(s)), s.size - 1] if s.size else np.zeros(0, np.int64)
    tp = np.cumsum(lab)[last]  # per tie group, descending: positives and negatives up to its end
    fp = (last + 1) - tp
    group_tp, group_fp = np.diff(np.r_[0.0, tp]), np.diff(np.r_[0.0, fp])
    counts = np.array([[lab.sum(), lab.size - lab.sum()]])
    if spread:  # ranges above this rank's come first in descending order
        counts = torch.cat(dist.all_gather_varsize(torch.from_numpy(counts), sampler_group())).numpy()
        tp, fp = tp + counts[me + 1:, 0].sum(), fp + counts[me + 1:, 1].sum()
    p, q = counts[:, 0].sum(), counts[:, 1].sum()
    sums = np.array([np.sum(group_tp * tp / np.maximum(tp + fp, 1)),
                     np.sum(group_tp * (q - fp + 0.5 * group_fp))])
    if spread:
        sums = dist.all_reduce(torch.from_numpy(sums), group=sampler_group()).numpy()
    ap = float(sums[0] / p) if p else float("nan")
    auc = float(sums[1] / (p * q)) if p and q else float("nan")
    return ap, auc


def average_precision(pos: np.ndarray, neg: np.ndarray) -> float:
    """AP of one rank's scores (see `ranking_metrics`)."""
    return ranking_metrics(pos, neg)[0]


def roc_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """ROC-AUC of one rank's scores (see `ranking_metrics`)."""
    return ranking_metrics(pos, neg)[1]


def mrr(pos: np.ndarray, neg: np.ndarray, across_ranks: bool = False) -> float:
    """Mean reciprocal rank of each positive among its row of negatives `neg` [P, n]; a tie
    counts half, so a constant scorer gets 1 / (n/2 + 1)."""
    pos = np.asarray(pos, dtype=np.float64)[:, None]
    neg = np.asarray(neg, dtype=np.float64)
    neg = neg[:, None] if neg.ndim == 1 else neg
    rank = 1.0 + (neg > pos).sum(1) + 0.5 * (neg == pos).sum(1)
    total = np.array([np.sum(1.0 / rank), rank.size])
    if across_ranks and dist.world_size() > 1:
        total = dist.all_reduce(torch.from_numpy(total), group=sampler_group()).numpy()
    return float(total[0] / total[1]) if total[1] else float("nan")


def link_metrics(pos: np.ndarray, neg: np.ndarray, across_ranks: bool = False) -> dict[str, float]:
    """AP and AUC of the positives against each one's first negative, MRR against all of them
    (over all ranks' events when `across_ranks`, a collective)."""
    neg = np.asarray(neg)
    neg = neg[:, None] if neg.ndim == 1 else neg
    ap, auc = ranking_metrics(pos, neg[:, 0], across_ranks)
    return {"ap": ap, "auc": auc, "mrr": mrr(pos, neg, across_ranks)}
