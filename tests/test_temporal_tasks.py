"""The tasks people bring to temporal graphs besides gnndist's link prediction: dynamic node
classification (JODIE's state labels), TGB's node property prediction (NDCG@10) and TGB's link
protocol (its split and fixed negatives, MRR), and random negatives drawn among the destinations
of a bipartite graph.

References: one process against 2 ranks (one launch runs every case), brute force (AUC,
accuracy, F1), py-tgb's Evaluators and negative generator (MRR, NDCG@10, TGB's pickles).
"""
import json
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from gnndist.cli import main
from gnndist.datasets import load
from gnndist.datasets.catalog import CATALOG, CONVERTED, PROTOCOL
from gnndist.datasets.formats import load_csv
from gnndist.datasets.pickles import restricted_load
from gnndist.datasets.tgb import write_protocol
from gnndist.errors import GnndistError
from gnndist.graph import TemporalGraph
from gnndist.outputs import Outputs
from gnndist.partition import partition_graph
from gnndist.runtime import dist as gdist
from gnndist.runtime.launch import launch
from gnndist.temporal.config import DecoderConfig, LinkConfig
from gnndist.temporal.events import RankEvents
from gnndist.temporal.fit import link_rank
from gnndist.temporal.linkpred import EvalNegatives, link_metrics, negative_candidates, train_negatives
from gnndist.temporal.nodes import (Decoder, LabelSource, NodeTask, Rows, event_probabilities, ndcg_at_k,
                                    node_metrics, node_rank)
from gnndist.temporal.protocol import Protocol
from gnndist.temporal.trainer import LinkTrainer

tgb_files = pytest.importorskip("test_tgb_files")  # py-tgb: the reference of TGB's files
from tgb.linkproppred.evaluate import Evaluator as LinkEvaluator  # noqa: E402
from tgb.nodeproppred.evaluate import Evaluator as NodeEvaluator  # noqa: E402

LINK = LinkConfig(epochs=1, batch_size=100, memory_dim=16, time_dim=16, quiet=True)
DECODER = DecoderConfig(epochs=12, patience=None, batch_size=64)  # several minibatches an epoch, with dropout
CPU = torch.device("cpu")


# ------------------------------------------------------------------------------------------ data

def tgbl_wiki_zip(folder: Path, out: Path, events: int = 600, num_neg: int = 8) -> None:
    """tgbl-wiki's zip: a JODIE-layout edge list and the negatives of its validation and test
    events made by py-tgb's own generator (hist_rnd; with 12 items, lists of 5-8)."""
    from tgb.linkproppred.negative_generator import NegativeEdgeGenerator
    from tgb.utils import pre_process
    from torch_geometric.data import TemporalData

    folder.mkdir(parents=True)
    csv = folder / "tgbl-wiki_edgelist_v2.csv"
    tgb_files.jodie_csv(csv, users=30, items=12, events=events, features=4)
    df, _, _ = pre_process.load_edgelist_wiki(str(csv))
    src, dst, t = (torch.from_numpy(df[c].to_numpy()).long() for c in ("u", "i", "ts"))
    ts = df["ts"].to_numpy()
    val_time, test_time = np.quantile(ts, [0.70, 0.85])  # TGB's generate_splits
    masks = {"train": ts <= val_time, "val": (ts > val_time) & (ts <= test_time), "test": ts > test_time}
    data = {k: TemporalData(src=src[m], dst=dst[m], t=t[m]) for k, m in masks.items()}
    gen = NegativeEdgeGenerator("tgbl-wiki", int(dst.min()), int(dst.max()), num_neg_e=num_neg, strategy="hist_rnd",
                                historical_data=data["train"])
    for split in ("val", "test"):
        gen.generate_negative_samples(data[split], split, str(folder))
        os.replace(folder / f"tgbl-wiki_{split}_ns.pkl", folder / f"tgbl-wiki_{split}_ns_v2.pkl")
    tgb_files.zipped(folder, out)


def served(mirror: Path, name: str) -> Path:
    """Where the mirror serves the dataset's (one) file."""
    url = CATALOG[name].files[0].url
    path = mirror / url.split("://", 1)[1]
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A JODIE CSV with state labels; tgbl-wiki and tgbn-trade by name from a local mirror
    (converted once into GNNDIST_DATA); each partitioned into a 2-part store."""
    root = tmp_path_factory.mktemp("tasks")
    mp = pytest.MonkeyPatch()
    mp.setenv("GNNDIST_DATA", str(root / "data"))
    mp.setenv("GNNDIST_DATA_MIRROR", (root / "mirror").as_uri())
    mp.setenv("GNNDIST_CACHE", str(root / "cache"))
    mp.setenv("GNNDIST_TIMEOUT", "120")
    tgb_files.jodie_csv(root / "wiki.csv", users=30, items=12, events=600, features=4)
    tgbl_wiki_zip(root / "tgbl_wiki", served(root / "mirror", "tgbl-wiki"))
    trade = root / "tgbn_trade"
    trade.mkdir()
    nations = [f"Nation {k}" for k in range(15)]
    tgb_files.string_events(trade / "tgbn-trade_edgelist.csv", "year,nation,trading nation,weight", nations, nations,
                            600)
    tgb_files.string_events(trade / "tgbn-trade_node_labels.csv", "year,nation,trading nation,weight", nations,
                            nations, 300)
    tgb_files.zipped(trade, served(root / "mirror", "tgbn-trade"))
    graphs = {"wiki": load_csv(str(root / "wiki.csv")), "tgbl": load("tgbl-wiki"), "tgbn": load("tgbn-trade")}
    stores = {}
    for name, g in graphs.items():
        partition_graph(g, 2, method="temporal", out=root / f"{name}-store")
        stores[name] = str(root / f"{name}-store")
    conv = {name: root / "data" / name / CONVERTED for name in ("tgbl-wiki", "tgbn-trade")}
    try:
        yield {"root": root, "graphs": graphs, "stores": stores, "tgbl": str(conv["tgbl-wiki"] / PROTOCOL),
               "tgbn": str(conv["tgbn-trade"] / PROTOCOL), "labels": str(conv["tgbn-trade"])}
    finally:
        mp.undo()


def worker(stores, tgbl, tgbn, labels, ckpt):
    gdist.setup("cpu")
    out = {"node": node_rank(stores["wiki"], CPU, LINK, DECODER, "node", Outputs(checkpoint=ckpt)),
           "link": link_rank(stores["tgbl"], CPU, LINK, Outputs(), tgbl),
           "property": node_rank(stores["tgbn"], CPU, LINK, DECODER, "node-property", Outputs(), tgbn,
                                 LabelSource(folder=labels))}
    gdist.teardown()
    return out


@pytest.fixture(scope="module")
def runs(data):
    """Every case on 2 ranks (one launch) and in one process."""
    root, g = data["root"], data["graphs"]
    two = launch(2, worker, data["stores"], data["tgbl"], data["tgbn"], data["labels"], str(root / "ckpt2"))[0]
    one = {"node": node_rank(g["wiki"], CPU, LINK, DECODER, "node", Outputs(checkpoint=str(root / "ckpt1"))),
           "link": link_rank(g["tgbl"], CPU, LINK, Outputs(), data["tgbl"]),
           "property": node_rank(g["tgbn"], CPU, LINK, DECODER, "node-property", Outputs(), data["tgbn"],
                                 LabelSource(folder=data["labels"]))}
    return one, two


def close(a, b, tol=1e-5):
    return np.allclose(np.asarray(a, float), np.asarray(b, float), rtol=tol, atol=tol)


# ------------------------------------------------------------------------------------------ W ranks

@pytest.mark.parametrize("case", ["node", "property"])
def test_node_tasks_on_two_ranks_equal_one_process(runs, case):
    """The link model, the rows, every decoder epoch's loss and validation metric, the selected
    epoch and the test metrics: as one process, up to float summation order."""
    one, two = (r[case] for r in runs)
    assert one["rows"] == two["rows"] and min(one["rows"].values()) > 0
    assert one["labels"] == two["labels"] == ("binary" if case == "node" else "distribution")
    assert close(one["link"]["test"]["ap"], two["link"]["test"]["ap"])
    for a, b in zip(one["epochs"], two["epochs"], strict=True):
        assert a.keys() == b.keys() and all(close(a[k], b[k]) for k in a if k != "epoch"), (a, b)
    assert one["selected_epoch"] == two["selected_epoch"]
    assert one["test"].keys() == two["test"].keys() == ({"auc", "ap", "best_val_auc"} if case == "node" else
                                                        {"ndcg", "best_val_ndcg"})
    assert all(close(one["test"][k], two["test"][k]) for k in one["test"])
    losses = [e["loss"] for e in one["epochs"]]
    assert losses[-1] < losses[0]  # the decoder learns


def test_tgb_link_protocol_on_two_ranks_equals_one_process(runs, data):
    """tgbl-wiki by name: TGB's split and negatives, the same metrics on 2 ranks; the random
    (training) negatives among the destinations, as on any bipartite graph."""
    one, two = (r["link"] for r in runs)
    split = json.loads((Path(data["tgbl"]) / "split.json").read_text())
    t = data["graphs"]["tgbl"].t
    val_time, test_time = np.quantile(t, [0.70, 0.85])
    assert (split["train_end"], split["val_end"]) == ((t <= val_time).sum(), (t <= test_time).sum())
    for m in (one, two):
        assert m["protocol"] == "tgb" and m["negatives"] == "destinations"
    assert all(close(one["test"][k], two["test"][k]) for k in ("ap", "auc", "mrr"))


def test_node_classification_checkpoint_predicts_per_event_probabilities(runs, data):
    """The decoder saved beside the link model (by 1 process, and by each of 2 ranks) gives every
    event's probability; those of the test events rank as the run's test AUC says."""
    g, root = data["graphs"]["wiki"], data["root"]
    p1 = event_probabilities(str(root / "ckpt1"), g, quiet=True)
    p2 = event_probabilities(str(root / "ckpt2"), g, quiet=True)
    assert p1.shape == (g.num_events,) and np.all((p1 > 0) & (p1 < 1)) and close(p1, p2)
    val_end = g.num_events - round(0.15 * g.num_events)
    y, p = g.edge_label[val_end:], p1[val_end:]
    assert abs(brute_auc(p[y == 1], p[y == 0]) - runs[0]["node"]["test"]["auc"]) < 1e-3


# ------------------------------------------------------------------------------------------ metrics

def brute_auc(pos, neg) -> float:
    """P(pos > neg) + P(pos = neg) / 2 over every pair."""
    pos, neg = np.asarray(pos, float)[:, None], np.asarray(neg, float)[None, :]
    return float(((pos > neg) + 0.5 * (pos == neg)).mean())


def passthrough(dim: int) -> Decoder:
    """A decoder whose outputs are its (non-negative) inputs."""
    d = Decoder(dim, dim, dim)
    with torch.no_grad():
        for layer in (d.hidden, d.out):
            layer.weight.copy_(torch.eye(dim))
            layer.bias.zero_()
    return d


def test_node_metrics_equal_brute_force():
    """AUC of two classes against every (positive, negative) pair, ties counted half; accuracy
    and macro F1 of several classes counted by hand."""
    rng = np.random.default_rng(0)
    n = 300
    scores = np.round(rng.random(n), 1).astype(np.float32)  # many ties
    y = (rng.random(n) < scores * 0.6).astype(np.int64)
    period = rng.integers(0, 3, n).astype(np.int8)
    rows = Rows(torch.from_numpy(scores[:, None]), np.arange(n), period, y)
    got = node_metrics(passthrough(1), rows, 2, NodeTask("binary", 2), CPU)
    t = period == 2
    assert got["auc"] == pytest.approx(brute_auc(scores[t][y[t] == 1], scores[t][y[t] == 0]), abs=1e-12)

    c = 4
    logits = rng.random((n, c)).astype(np.float32)
    y = rng.integers(0, c, n)
    y[:3] = 0  # class 3 never predicted in the rows below? counted all the same
    rows = Rows(torch.from_numpy(logits), np.arange(n), period, y)
    got = node_metrics(passthrough(c), rows, 1, NodeTask("classes", c), CPU)
    v = period == 1
    pred, true = logits[v].argmax(1), y[v]
    f1 = []
    for k in range(c):
        tp, fp, fn = ((pred == k) & (true == k)).sum(), ((pred == k) & (true != k)).sum(), \
            ((pred != k) & (true == k)).sum()
        if tp + fp + fn:
            f1.append(2 * tp / (2 * tp + fp + fn))
    assert got["acc"] == pytest.approx((pred == true).mean()) and got["f1"] == pytest.approx(np.mean(f1))


def test_ndcg_at_10_equals_py_tgb_evaluator():
    """NDCG@10 of rows with tied scores and rows without gains, per label time as py-tgb's
    Evaluator computes it, averaged over the label times as TGB's examples average it."""
    rng = np.random.default_rng(1)
    n, c, times = 240, 30, 5
    y_true = np.where(rng.random((n, c)) < 0.2, rng.random((n, c)), 0.0)
    y_true[:4] = 0  # no interactions at all
    y_pred = np.round(rng.random((n, c)), 1)  # ties, also across the top 10
    y_pred[4] = 0.5  # all tied
    time = rng.integers(0, times, n)
    ev = NodeEvaluator("tgbn-trade")
    per_row = ndcg_at_k(y_true, y_pred)
    for k in range(times):
        ref = ev.eval({"y_true": y_true[time == k], "y_pred": y_pred[time == k], "eval_metric": ["ndcg"]})["ndcg"]
        assert per_row[time == k].mean() == pytest.approx(ref, abs=1e-12), k
    ptr = np.r_[0, np.cumsum((y_true > 0).sum(1))]
    r, cls = np.nonzero(y_true > 0)
    rows = Rows(torch.from_numpy(y_pred.astype(np.float32)), np.arange(n), np.zeros(n, np.int8), None, ptr, cls,
                y_true[r, cls].astype(np.float32), time)
    got = node_metrics(passthrough(c), rows, 0, NodeTask("distribution", c), CPU, times)["ndcg"]
    # rounded to float32 on the way through the decoder: the same ties, so the same ranking
    ref = np.mean([ev.eval({"y_true": y_true[time == k], "y_pred": y_pred[time == k],
                            "eval_metric": ["ndcg"]})["ndcg"] for k in range(times)])
    assert got == pytest.approx(ref, abs=1e-9)


def test_tgb_negatives_and_mrr_equal_py_tgb(data):
    """Each test event is scored against TGB's own list for it (its pickle's, by (src, dst, t)),
    and the MRR over them is py-tgb's Evaluator's on the same scores."""
    g = data["graphs"]["tgbl"]
    protocol = Protocol.of(g.num_events, data["tgbl"])
    with zipfile.ZipFile(served(data["root"] / "mirror", "tgbl-wiki")) as z:
        lists = pickle.loads(z.read("tgbl-wiki_test_ns_v2.pkl"))  # py-tgb's own file: the reference reads it
    lo, hi = protocol.val_end, g.num_events
    ids = g.orig_ids
    fixed = protocol.fixed_negatives(lo, hi, LINK.batch_size)
    for index, s in enumerate(range(lo, hi, LINK.batch_size)):
        e = min(s + LINK.batch_size, hi)
        got = fixed.batch(index, e - s, np.arange(e - s), g.src[s:e], g.dst[s:e])
        for j, k in enumerate(range(s, e)):
            want = lists[(ids[g.src[k]], ids[g.dst[k]], int(g.t[k]))]
            assert sorted(set(ids[got[j]]) - {ids[g.dst[k]]}) == sorted(want), k
    tr = LinkTrainer(RankEvents.from_graph(g), LINK, CPU, protocol)
    tr.halves = 1
    tr.evaluate(0, lo, "replay", score=False)
    pos, neg, eid, _, _ = tr.evaluate(lo, hi, "test")
    ev = LinkEvaluator("tgbl-wiki")
    per_event = []
    for j, k in enumerate(eid):
        want = lists[(ids[g.src[k]], ids[g.dst[k]], int(g.t[k]))]
        scored = neg[j][~np.isnan(neg[j])]
        assert scored.size == len(want)
        per_event.append(ev.eval({"y_pred_pos": pos[j:j + 1], "y_pred_neg": scored[None],
                                  "eval_metric": ["mrr"]})["mrr"])
    assert link_metrics(pos, neg)["mrr"] == pytest.approx(np.mean(per_event), abs=1e-6)


# ------------------------------------------------------------------------------------------ TGB's pickles

class Code:
    def __reduce__(self):
        return os.system, ("touch hacked",)


def test_the_unpickler_refuses_a_pickle_that_asks_for_code(tmp_path, monkeypatch):
    """A pickle of TGB's negatives that would call os.system: refused by name, nothing run, no
    protocol written; an array whose buffer is not its bytes: refused too."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "tgbl_wiki"
    folder.mkdir()
    tgb_files.jodie_csv(folder / "tgbl-wiki_edgelist_v2.csv", users=10, items=5, events=60, features=2)
    for split in ("val", "test"):
        (folder / f"tgbl-wiki_{split}_ns_v2.pkl").write_bytes(pickle.dumps({(0, 10, 1): Code()}, protocol=5))
    g = load(tgb_files.zipped(folder, tmp_path / "tgbl-wiki-v2.zip"))
    with pytest.raises(GnndistError, match=r"tgbl-wiki_val_ns_v2\.pkl: not a valid pickle of TGB's negatives: "
                                           r"refusing to load global '(posix|os)\.system'"):
        write_protocol(str(tmp_path / "tgbl-wiki-v2.zip"), g, tmp_path / "protocol")
    assert not (tmp_path / "hacked").exists() and not (tmp_path / "protocol" / "split.json").exists()
    import io

    from numpy._core.numeric import _frombuffer

    class Lying:
        def __reduce__(self):
            return _frombuffer, (b"\0" * 8, np.dtype("i8"), (1 << 40,), "C")
    with pytest.raises(GnndistError, match="not exactly its bytes"):
        restricted_load(io.BytesIO(pickle.dumps(Lying(), protocol=5)), "x.pkl", "pickle")
    arr = np.arange(6, dtype=np.int64).reshape(2, 3)
    assert np.array_equal(restricted_load(io.BytesIO(pickle.dumps(arr, protocol=5)), "x.pkl", "pickle"), arr)


# ------------------------------------------------------------------------------------------ negatives

def test_a_bipartite_graphs_random_negatives_are_destinations(data):
    """JODIE's users and items: training negatives among the training events' destinations,
    evaluation negatives among all destinations, never the event's own; any other graph: any
    node. The metrics JSON says which."""
    g = data["graphs"]["wiki"]
    train_end = 420
    cand = negative_candidates(RankEvents.from_graph(g), train_end)
    assert cand.kind == "destinations"
    assert np.array_equal(cand.train, np.unique(g.dst[:train_end])) and np.array_equal(cand.eval, np.unique(g.dst))
    rows = np.arange(100)
    neg = train_negatives(0, 1, 3, 100, rows, g.dst[300:400], g.num_nodes, cand.train)
    assert np.isin(neg, cand.train).all() and (neg[:, 0] != g.dst[300:400]).all()
    assert np.unique(neg).size > 3
    ev = EvalNegatives(g.src, g.dst, np.arange(g.num_events), g.num_nodes, train_end, 510, "random", 5, 0, cand.eval)
    neg = ev.batch(0, 90, np.arange(90), g.src[train_end:510], g.dst[train_end:510])
    assert np.isin(neg, cand.eval).all() and (neg != g.dst[train_end:510, None]).all()
    users_too = TemporalGraph(np.r_[g.src, 0], np.r_[g.dst, 1], np.r_[g.t, g.t[-1]])  # user 0 -> user 1
    assert negative_candidates(RankEvents.from_graph(users_too), train_end) == ("all", None, None)


def test_train_task_node_on_a_jodie_csv_and_predict(data, tmp_path, capsys):
    """`gnndist train FILE --task node` on JODIE's CSV: the node metrics JSON (test AUC) with its
    link model's (negatives among destinations); `gnndist predict` writes a probability per event."""
    csv = str(data["root"] / "wiki.csv")
    out, ckpt = tmp_path / "m.json", tmp_path / "ckpt"
    assert main(["train", csv, "--task", "node", "--epochs", "1", "--memory-dim", "16", "--batch-size", "100",
                 "--hidden", "32", "--quiet", "--metrics-out", str(out), "--checkpoint", str(ckpt)]) == 0
    m = json.loads(out.read_text())
    assert m["task"] == "node" and m["graph"] == "temporal" and set(m["test"]) == {"auc", "ap", "best_val_auc"}
    assert m["link"]["negatives"] == "destinations" and m["link"]["protocol"] == "gnndist"
    assert m["decoder"]["hidden"] == 32
    assert "--task node (binary labels): test auc" in capsys.readouterr().out
    assert main(["predict", str(ckpt), csv, "-o", str(tmp_path / "p.csv"), "--quiet"]) == 0
    lines = (tmp_path / "p.csv").read_text().splitlines()
    assert lines[0] == "event,p" and len(lines) == 601
    assert main(["train", csv, "--task", "node", "--fanouts", "5,5"]) == 2
    assert "--fanouts applies to node classification on static graphs only" in capsys.readouterr().err
