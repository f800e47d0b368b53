"""Link-prediction negatives and metrics (AP, ROC-AUC, MRR), ties counted fairly, on one rank or
over the scores of all ranks.

Negatives are drawn per global batch, from random streams keyed by (seed, period or epoch,
batch index), in original node ids: any rank draws the rows of its own events of the batch and
gets what one process would draw. Strategies follow Poursafaei et al. 2022, with the source of
each positive kept so that every positive has its own list of negative destinations (needed for
MRR): `random` (any node), `historical` (a destination the source reached before the evaluated
period), `inductive` (a destination the source reaches in the evaluated period but never before
it). A source without such candidates falls back to random destinations. A negative never
equals its positive's destination. Candidates of a source come from its own events, which the
rank that owns the source holds.
"""
from __future__ import annotations

import numpy as np
import torch

from gnndist.runtime import dist
from gnndist.errors import GnndistError
from gnndist.graph import indptr_of, unique_ints
from gnndist.samplers import sampler_group
from gnndist.temporal.config import NEG_STRATEGIES


def train_negatives(seed: int, epoch: int, batch_index: int, batch_size: int, rows: np.ndarray, dst: np.ndarray,
                    num_nodes: int) -> np.ndarray:
    """One random negative destination [len(rows), 1] (original ids) for the events at positions
    `rows` (with original destinations `dst`) of global training batch `batch_index` of
    `batch_size` events, seeded by (seed, epoch, batch index) only."""
    rng = np.random.default_rng([seed, epoch, batch_index, 0x7E57])
    return _other(rng.integers(1, max(num_nodes, 2), size=(batch_size, 1))[rows], dst, num_nodes)


def _other(off: np.ndarray, dst: np.ndarray, num_nodes: int) -> np.ndarray:
    """Node ids `dst + off` (offsets in [1, N)), which never equal their row's `dst`."""
    if num_nodes < 2:
        raise GnndistError("negative sampling needs at least 2 nodes")
    return (np.asarray(dst, np.int64)[:, None] + off) % num_nodes


class EvalNegatives:
    """Fixed negatives [B, n] for the events of a validation or test period [start, stop), drawn
    per global batch. `src`, `dst`, `eid` are the (original-id) events whose sources this rank
    owns; candidates of `historical` come from those before `start`, of `inductive` from the pairs
    in the period that never occur before it."""

    def __init__(self, src: np.ndarray, dst: np.ndarray, eid: np.ndarray, num_nodes: int, start: int, stop: int,
                 strategy: str = "random", n: int = 1, seed: int = 0) -> None:
        if strategy not in NEG_STRATEGIES:
            raise GnndistError(f"unknown negative sampling {strategy!r}; choose one of {', '.join(NEG_STRATEGIES)}")
        self.num_nodes, self.start, self.strategy, self.n, self.seed = num_nodes, start, strategy, n, seed
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
        out = _other(rng.integers(1, max(self.num_nodes, 2), size=(batch_size, self.n))[rows], dst, self.num_nodes)
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
