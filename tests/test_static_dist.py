"""Node classification on 2 gloo ranks against the single-process trainer."""
import numpy as np
import pytest
import torch

from gnndist.runtime.launch import launch
from gnndist.runtime import dist
from gnndist.graph import Graph
from gnndist.partition import load_partition, partition_graph
from gnndist.static.trainer import WholeGraph, NodeConfig, NodeTrainer, PartGraph
from sites import off_device_sites, record_sites


@pytest.fixture(scope="module", autouse=True)
def short_timeout():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GNNDIST_TIMEOUT", "60")
        yield


def two_clusters(n: int = 80, m: int = 300, seed: int = 0) -> Graph:
    """Two dense halves joined by 4 edges; 30 training nodes in the first half, 2 in the second,
    so the part holding the second half runs out of batches early."""
    rng = np.random.default_rng(seed)
    h = n // 2
    a = rng.integers(0, h, (2, m))
    b = rng.integers(h, n, (2, m))
    cross = np.stack([rng.integers(0, h, 4), rng.integers(h, n, 4)])
    src, dst = np.concatenate([a, b, cross], 1)
    keep = src != dst
    train = np.zeros(n, bool)
    train[:30] = train[h:h + 2] = True
    val = ~train & (np.arange(n) % 2 == 0)
    return Graph.from_edges(src[keep], dst[keep], n, undirected=True, dedup=True,
                            x=rng.normal(size=(n, 6)).astype(np.float32), y=rng.integers(0, 3, n),
                            train_mask=train, val_mask=val, test_mask=~train & ~val)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    g = two_clusters()
    out = tmp_path_factory.mktemp("static") / "parts"
    partition_graph(g, 2, method="metis", balance=["nodes"], out=out)
    return g, str(out)


def trace(part, cfg: NodeConfig):
    """Two epochs; after every step: (epoch, seeds as original ids, all parameters); `part`
    None: the whole graph in this process."""
    trainer = NodeTrainer(WholeGraph(two_clusters()) if part is None else PartGraph(part, cfg), cfg)
    if part is None:
        return _trace_steps(trainer, lambda seeds: seeds)
    return _trace_steps(trainer, lambda seeds: part.orig_ids[seeds - part.start])


def _trace_steps(trainer: NodeTrainer, original):
    trace, records = [], []
    params = lambda: torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()]).numpy().copy()
    for epoch in (1, 2):
        records.append(trainer.train_epoch(epoch, lambda step, seeds, e=epoch: trace.append(
            (e, original(seeds), params()))))
    return trace, records


def equivalence(part, models: list[str]):
    """Per model: full-neighbourhood logits of the owned nodes, and the gradients of one step
    on the first few owned training nodes (dropout off)."""
    out = {}
    for model in models:
        cfg = NodeConfig.for_model(model, hidden=16, dropout=0.0, fanouts=[3, 3], seed=5)
        trainer = NodeTrainer(PartGraph(part, cfg), cfg)
        logits = trainer.logits(np.arange(part.start, part.stop))
        seeds = trainer.graph.train_ids[:5]
        trainer.compute_grads(seeds, trainer.batch(seeds, [-1, -1], 0))
        out[model] = (part.orig_ids, logits.numpy(), part.orig_ids[seeds - part.start],
                      [p.grad.numpy().copy() for p in trainer.model.parameters()])
    return out


MODELS = ["sage", "gcn", "gat"]
TRACE_CFG = NodeConfig.for_model("gat", hidden=16, batch_size=8, fanouts=[3, 3], cache="presample", cache_size=0.5)
# without dropout (whose masks each rank draws), training is one process's on any rank layout
EXACT_CFGS = {m: NodeConfig.for_model(m, hidden=16, batch_size=8, fanouts=[3, 3], dropout=0.0) for m in MODELS}


def worker(store_dir: str):
    dist.setup("cpu")
    sites = record_sites()
    part = load_partition(store_dir, dist.rank(), dist.world_size())
    out = trace(part, TRACE_CFG), equivalence(part, MODELS), sites, {m: trace(part, c) for m, c in EXACT_CFGS.items()}
    dist.teardown()
    return out


@pytest.fixture(scope="module")
def ranks(short_timeout, store):
    """Both workloads in one 2-rank launch (launching dominates the cost)."""
    return launch(2, worker, store[1])


def test_two_ranks_cover_the_training_set_with_identical_parameters(store, ranks):
    g = store[0]
    (t0, rec0), (t1, rec1) = (r[0] for r in ranks)
    assert len(t0) == len(t1) > 0
    assert any(s.size == 0 for _, s, _ in t0 + t1)  # one rank ran empty steps
    for (e0, _, p0), (e1, _, p1) in zip(t0, t1):
        assert e0 == e1 and np.array_equal(p0, p1)
    assert not np.array_equal(t0[0][2], t0[-1][2])
    for epoch in (1, 2):
        seen = np.concatenate([s for e, s, _ in t0 + t1 if e == epoch])
        assert np.array_equal(np.sort(seen), np.flatnonzero(g.train_mask))
    for r0, r1 in zip(rec0, rec1):
        assert r0 == {**r1, "time_s": r0["time_s"], "nodes_per_s": r0["nodes_per_s"]}
        assert r0["remote_bytes"] > 0 and 0 <= r0["cache_hit_rate"] <= 1


def test_two_ranks_with_full_fanout_match_one_rank(store, ranks):
    g = store[0]
    ranks = [r[1] for r in ranks]
    for model in MODELS:
        single = NodeTrainer(WholeGraph(g), NodeConfig.for_model(model, hidden=16, dropout=0.0, fanouts=[3, 3], seed=5))
        ref = single.logits(np.arange(g.num_nodes)).numpy()
        for ids, logits, _, _ in (r[model] for r in ranks):
            np.testing.assert_allclose(logits, ref[ids], atol=1e-5, rtol=1e-4)
        # the summed gradient of the two local batches is the gradient of their union
        union = np.concatenate([r[model][2] for r in ranks])
        single.compute_grads(union, single.batch(union, [-1, -1], 0))
        for _, _, _, grads in (r[model] for r in ranks):
            for got, p in zip(grads, single.model.parameters()):
                np.testing.assert_allclose(got, p.grad.numpy(), atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("model", MODELS)
def test_without_dropout_two_ranks_train_as_one_process(ranks, model):
    """The same global batches (the epoch's order of the training nodes' original ids, cut
    every batch_size), the same samples (streams keyed by original ids): the parameters after
    every step and the epochs' metrics are one process's, up to float summation order."""
    one, records = trace(None, EXACT_CFGS[model])
    (t0, rec0), (t1, _) = (r[3][model] for r in ranks)
    assert len(t0) == len(one)
    for (e, s0, p0), (_, s1, _), (e1, s, p) in zip(t0, t1, one):
        assert e == e1 and np.array_equal(np.sort(np.concatenate([s0, s1])), np.sort(s))
        np.testing.assert_allclose(p0, p, rtol=1e-4, atol=1e-6)
    for r, r1 in zip(rec0, records):
        assert r["loss"] == pytest.approx(r1["loss"], rel=1e-5) and r["train_acc"] == r1["train_acc"]


def test_host_side_exchanges_go_on_the_gloo_group(ranks):
    """Only device tensors on the default group (NCCL under --device cuda): tests/sites.py."""
    for r in ranks:
        assert not off_device_sites(r[2])
        assert any(site.startswith("samplers/") and not default for site, default in r[2])
