"""Link-prediction negatives and metrics (AP, ROC-AUC, MRR), ties counted fairly.

Negative strategies follow Poursafaei et al. 2022, with the source of each positive kept so
that every positive has its own list of negative destinations (needed for MRR):
`random` (any node), `historical` (a destination the source reached before the evaluated
period), `inductive` (a destination the source reaches in the evaluated period but never
before it). A source without such candidates falls back to random destinations. A negative
never equals its positive's destination.
"""
from __future__ import annotations

import numpy as np

from gnndist.errors import GnndistError
from gnndist.graph import TemporalGraph, indptr_of, unique_ints

NEG_STRATEGIES = ("random", "historical", "inductive")


def _random_other(rng: np.random.Generator, dst: np.ndarray, num_nodes: int, n: int) -> np.ndarray:
    """[len(dst), n] uniform random node ids, each different from its row's `dst`."""
    if num_nodes < 2:
        raise GnndistError("negative sampling needs at least 2 nodes")
    off = rng.integers(1, num_nodes, size=(dst.size, n))
    return (dst[:, None] + off) % num_nodes


def train_negatives(seed: int, epoch: int, batch_index: int, dst: np.ndarray, num_nodes: int) -> np.ndarray:
    """One random negative destination per event of a global training batch, seeded by
    (seed, epoch, batch index) only, so any rank can draw its share of the same batch."""
    rng = np.random.default_rng([seed, epoch, batch_index, 0x7E57])
    return _random_other(rng, np.asarray(dst, dtype=np.int64), num_nodes, 1)[:, 0]


def _pairs_csr(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (src, dst) pairs as CSR over src: (indptr, dst sorted per src)."""
    key = unique_ints(src * num_nodes + dst)
    s, d = key // num_nodes, key % num_nodes
    return indptr_of(s, num_nodes), d


def eval_negatives(tg: TemporalGraph, start: int, stop: int, strategy: str = "random", n: int = 1,
                   seed: int = 0) -> np.ndarray:
    """Fixed negatives [stop - start, n] for the events [start, stop) (a val or test period).

    `historical` candidates come from the events before `start`; `inductive` ones from the
    pairs of [start, stop) that never occur before `start`.
    """
    if strategy not in NEG_STRATEGIES:
        raise GnndistError(f"unknown negative sampling {strategy!r}; choose one of {', '.join(NEG_STRATEGIES)}")
    rng = np.random.default_rng([seed, start, stop, NEG_STRATEGIES.index(strategy)])
    src, dst = tg.src[start:stop], tg.dst[start:stop]
    out = _random_other(rng, dst, tg.num_nodes, n)
    if strategy == "random" or src.size == 0:
        return out
    N = tg.num_nodes
    if strategy == "historical":
        indptr, cand = _pairs_csr(tg.src[:start], tg.dst[:start], N)
    else:
        seen = unique_ints(tg.src[:start] * N + tg.dst[:start])
        key = src * N + dst
        new = ~np.isin(key, seen)
        indptr, cand = _pairs_csr(src[new], dst[new], N)
    count = indptr[src + 1] - indptr[src]
    idx = indptr[src][:, None] + (rng.random((src.size, n)) * count[:, None]).astype(np.int64)
    pick = cand[np.minimum(idx, cand.size - 1)] if cand.size else out
    use = (count[:, None] > 0) & (pick != dst[:, None])
    return np.where(use, pick, out)


def average_precision(pos: np.ndarray, neg: np.ndarray) -> float:
    """Area under the precision-recall step curve; tied scores form one threshold (NaN
    without positives)."""
    if len(pos) == 0:
        return float("nan")
    scores = np.concatenate([pos, neg]).astype(np.float64)
    labels = np.concatenate([np.ones(len(pos)), np.zeros(len(neg))])
    order = np.argsort(-scores, kind="stable")
    scores, labels = scores[order], labels[order]
    last = np.r_[np.flatnonzero(np.diff(scores)), scores.size - 1]  # end of each tie group
    tp = np.cumsum(labels)[last]
    fp = (last + 1) - tp
    precision, recall = tp / (tp + fp), tp / tp[-1]
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def roc_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(score(pos) > score(neg)) + P(equal) / 2, from average ranks."""
    p, q = len(pos), len(neg)
    if p == 0 or q == 0:
        return float("nan")
    scores = np.concatenate([pos, neg]).astype(np.float64)
    order = np.argsort(scores, kind="stable")
    s = scores[order]
    first = np.r_[0, np.flatnonzero(np.diff(s)) + 1]
    size = np.diff(np.r_[first, s.size])
    ranks = np.empty(s.size)
    ranks[order] = np.repeat(first + (size + 1) / 2.0, size)  # 1-based average ranks
    return float((ranks[:p].sum() - p * (p + 1) / 2.0) / (p * q))


def mrr(pos: np.ndarray, neg: np.ndarray) -> float:
    """Mean reciprocal rank of each positive among its row of negatives `neg` [P, n]; a tie
    counts half, so a constant scorer gets 1 / (n/2 + 1)."""
    pos = np.asarray(pos, dtype=np.float64)[:, None]
    neg = np.asarray(neg, dtype=np.float64)
    neg = neg[:, None] if neg.ndim == 1 else neg
    rank = 1.0 + (neg > pos).sum(1) + 0.5 * (neg == pos).sum(1)
    return float(np.mean(1.0 / rank)) if rank.size else float("nan")


def link_metrics(pos: np.ndarray, neg: np.ndarray) -> dict[str, float]:
    """AP and AUC of the positives against each one's first negative, MRR against all of them."""
    neg = np.asarray(neg)
    neg = neg[:, None] if neg.ndim == 1 else neg
    return {"ap": average_precision(pos, neg[:, 0]), "auc": roc_auc(pos, neg[:, 0]), "mrr": mrr(pos, neg)}
