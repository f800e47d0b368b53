"""Link-prediction metrics against brute-force definitions, and the negative samplers."""
import numpy as np
import pytest

from gnndist.errors import GnndistError
from gnndist.graph import TemporalGraph
from gnndist.runtime.launch import launch
from gnndist.temporal.linkpred import (EvalNegatives, average_precision, link_metrics, mrr, roc_auc,
                                       train_negatives)


def eval_negatives(tg, start, stop, strategy="random", n=1, seed=0, batch=None):
    """Negatives of the period [start, stop) in global batches of `batch` (default: one batch)."""
    neg = EvalNegatives(tg.src, tg.dst, np.arange(tg.num_events), tg.num_nodes, start, stop, strategy, n, seed)
    b = batch or stop - start
    return np.concatenate([neg.batch(i, min(s + b, stop) - s, np.arange(min(s + b, stop) - s), tg.src[s:s + b][:stop - s],
                                     tg.dst[s:s + b][:stop - s]) for i, s in enumerate(range(start, stop, b))])


def brute_ap(pos, neg):
    """AP from its definition: each distinct threshold, precision times the recall gained."""
    scores = np.r_[pos, neg]
    labels = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    ap, prev_recall = 0.0, 0.0
    for thr in sorted(set(scores.tolist()), reverse=True):
        sel = scores >= thr
        recall = labels[sel].sum() / len(pos)
        ap += (recall - prev_recall) * labels[sel].mean()
        prev_recall = recall
    return ap


def brute_auc(pos, neg):
    return np.mean([(p > q) + 0.5 * (p == q) for p in pos for q in neg])


@pytest.mark.parametrize("levels", [3, 1000])  # many ties, few ties
def test_ap_auc_match_definitions(levels):
    rng = np.random.default_rng(levels)
    pos = rng.integers(0, levels, 60) / levels + 0.1
    neg = rng.integers(0, levels, 80) / levels
    assert average_precision(pos, neg) == pytest.approx(brute_ap(pos, neg), abs=1e-12)
    assert roc_auc(pos, neg) == pytest.approx(brute_auc(pos, neg), abs=1e-12)


def test_perfect_and_worst_scores():
    assert average_precision(np.array([2.0, 3.0]), np.array([0.0, 1.0])) == 1.0
    assert roc_auc(np.array([2.0, 3.0]), np.array([0.0, 1.0])) == 1.0
    assert roc_auc(np.array([0.0]), np.array([1.0, 2.0])) == 0.0


@pytest.mark.parametrize("n", [1, 4, 9])
def test_mrr_constant_scorer_counts_ties_half(n):
    pos, neg = np.zeros(7), np.zeros((7, n))
    assert mrr(pos, neg) == pytest.approx(1.0 / (n / 2 + 1))
    assert roc_auc(pos, neg[:, 0]) == 0.5


def test_mrr_matches_ranks():
    rng = np.random.default_rng(1)
    pos = rng.integers(0, 4, 50).astype(float)
    neg = rng.integers(0, 4, (50, 6)).astype(float)
    ranks = [1 + sum(q > p for q in row) + 0.5 * sum(q == p for q in row) for p, row in zip(pos, neg)]
    assert mrr(pos, neg) == pytest.approx(np.mean(1.0 / np.array(ranks)))
    m = link_metrics(pos, neg)
    assert m["ap"] == pytest.approx(brute_ap(pos, neg[:, 0])) and m["mrr"] == pytest.approx(mrr(pos, neg))


def _graph():
    rng = np.random.default_rng(0)
    e, n = 400, 30
    return TemporalGraph(rng.integers(0, n, e), rng.integers(0, n, e), np.sort(rng.random(e)), num_nodes=n)


def test_random_negatives_fixed_and_never_the_positive():
    tg = _graph()
    a = eval_negatives(tg, 300, 400, "random", 5, seed=3)
    assert a.shape == (100, 5) and a.min() >= 0 and a.max() < tg.num_nodes
    assert not (a == tg.dst[300:400, None]).any()
    assert np.array_equal(a, eval_negatives(tg, 300, 400, "random", 5, seed=3))
    assert not np.array_equal(a, eval_negatives(tg, 300, 400, "random", 5, seed=4))


def test_historical_and_inductive_candidates():
    tg = _graph()
    start, stop, n = 300, 400, 4
    past = {(s, d) for s, d in zip(tg.src[:start].tolist(), tg.dst[:start].tolist())}
    period = {(s, d) for s, d in zip(tg.src[start:stop].tolist(), tg.dst[start:stop].tolist())}
    hist = eval_negatives(tg, start, stop, "historical", n, seed=0)
    ind = eval_negatives(tg, start, stop, "inductive", n, seed=0)
    checked = 0
    for i, (s, d) in enumerate(zip(tg.src[start:stop].tolist(), tg.dst[start:stop].tolist())):
        assert d not in hist[i] and d not in ind[i]
        # a draw equal to the positive is replaced at random, so check rows where none can be
        hist_cands = {y for x, y in past if x == s}
        ind_cands = {y for x, y in period - past if x == s}
        if hist_cands and d not in hist_cands:
            assert set(hist[i].tolist()) <= hist_cands
            checked += 1
        if ind_cands and d not in ind_cands:
            assert set(ind[i].tolist()) <= ind_cands
            checked += 1
    assert checked > 50
    # historical draws mostly come from the source's history (random fallback only without one)
    frac = np.mean([(s, x) in past for s, row in zip(tg.src[start:stop], hist) for x in row.tolist()])
    assert frac > 0.9
    with pytest.raises(GnndistError):
        eval_negatives(tg, start, stop, "nope")


def test_train_negatives_are_per_global_batch():
    dst = np.arange(200) % 50
    rows = np.arange(200)
    whole = train_negatives(7, 2, 5, 200, rows, dst, 50)[:, 0]
    assert np.array_equal(whole, train_negatives(7, 2, 5, 200, rows, dst, 50)[:, 0])
    assert not np.array_equal(whole, train_negatives(7, 2, 6, 200, rows, dst, 50)[:, 0])
    assert not (whole == dst).any()
    # any rank draws the rows of its own events of the batch and gets the same draws
    part = rows[rows % 3 == 1]
    assert np.array_equal(train_negatives(7, 2, 5, 200, part, dst[part], 50)[:, 0], whole[part])


def test_eval_negatives_of_a_rank_equal_one_process_rows():
    """A rank owning some sources gets, for their events, the negatives one process draws."""
    tg = _graph()
    start, stop = 300, 400
    for strategy in ("random", "historical", "inductive"):
        whole = eval_negatives(tg, start, stop, strategy, 3, seed=2, batch=30)
        mine = np.flatnonzero(tg.src % 2 == 0)  # the events of this rank's sources
        neg = EvalNegatives(tg.src[mine], tg.dst[mine], mine, tg.num_nodes, start, stop, strategy, 3, 2)
        for i, s in enumerate(range(start, stop, 30)):
            e = min(s + 30, stop)
            rows = mine[(mine >= s) & (mine < e)] - s
            got = neg.batch(i, e - s, rows, tg.src[s + rows], tg.dst[s + rows])
            assert np.array_equal(got, whole[s - start + rows]), (strategy, i)


def _ranked_worker(pos, neg):
    from gnndist.runtime import dist

    dist.setup("cpu")
    r, w = dist.rank(), dist.world_size()
    # each rank a different, uneven share; one rank gets nothing
    p, q = pos[r::w] if r != 1 else pos[:0], neg[r::w] if r != 1 else neg[:0]
    if r == 0:
        p, q = np.concatenate([p, pos[1::w]]), np.concatenate([q, neg[1::w]])
    out = link_metrics(p, q, across_ranks=True)
    dist.teardown()
    return out


@pytest.mark.parametrize("levels", [3, 1000])
def test_metrics_over_ranks_equal_one_process(levels):
    rng = np.random.default_rng(levels)
    pos = rng.integers(0, levels, 90) / levels + 0.1
    neg = rng.integers(0, levels, (90, 4)) / levels
    for m in launch(3, _ranked_worker, pos, neg):
        assert m["ap"] == pytest.approx(brute_ap(pos, neg[:, 0]), abs=1e-12)
        assert m["auc"] == pytest.approx(brute_auc(pos, neg[:, 0]), abs=1e-12)
        assert m["mrr"] == pytest.approx(mrr(pos, neg), abs=1e-12)
