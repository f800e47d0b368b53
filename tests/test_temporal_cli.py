"""`gnndist train --task link` end to end: metrics JSON, checkpoints and resume, user errors; the
flag checks of `LinkConfig` and what the trainer allocates against `gnndist.footprint`."""
import dataclasses
import json
import re

import numpy as np
import pytest
import torch

from gnndist import checkpoint, footprint
from gnndist.cli import main
from gnndist.errors import GnndistError
from gnndist.temporal.footprint import link_footprint
from gnndist.graph import TemporalGraph
from gnndist.partition.stats import fmt_bytes
from gnndist.temporal import trainer as trainer_module
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.events import RankEvents
from gnndist.temporal.models import MODELS
from gnndist.temporal.trainer import LinkTrainer

DATA = ["synthetic-temporal", "--num-nodes", "80", "--num-events", "1200", "--memory-dim", "16", "--epochs", "3",
        "--batch-size", "100", "--lr", "0.003", "--quiet"]


def train(tmp_path, name, *extra):
    out = tmp_path / f"{name}.json"
    assert main(["train", *DATA, "--task", "link", "--metrics-out", str(out), *extra]) == 0
    return json.loads(out.read_text())


def test_metrics_json_has_the_documented_keys(tmp_path, capsys):
    m = train(tmp_path, "m", "--model", "tgn", "--epochs", "2", "--neg", "historical")
    assert m["task"] == "link" and m["model"] == "tgn" and m["world_size"] == 1
    assert [e["epoch"] for e in m["epochs"]] == [1, 2]
    for e in m["epochs"]:
        assert {"epoch", "loss", "time_s", "events_per_s", "val_ap", "val_auc", "val_mrr"} <= set(e)
        assert e["events_per_s"] > 0 and 0 <= e["val_ap"] <= 1
    assert {"ap", "auc", "mrr", "inductive_ap", "inductive_auc", "inductive_mrr"} <= set(m["test"])
    assert m["epochs"][1]["loss"] < m["epochs"][0]["loss"]
    table = capsys.readouterr().out
    assert "AP" in table and "MRR" in table and "test" in table


def test_resume_ends_with_the_same_metrics(tmp_path):
    full = train(tmp_path, "full", "--model", "dyrep", "--epochs", "2", "--checkpoint", str(tmp_path / "a"))
    train(tmp_path, "half", "--model", "dyrep", "--epochs", "1", "--checkpoint", str(tmp_path / "b"))
    resumed = train(tmp_path, "resumed", "--model", "dyrep", "--epochs", "2", "--checkpoint", str(tmp_path / "b"),
                    "--resume")
    assert resumed["test"] == full["test"]
    def same(e):  # all but times
        return {k: v for k, v in e.items() if not k.endswith("_s") and k != "events_per_s"}
    assert [same(e) for e in resumed["epochs"]] == [same(e) for e in full["epochs"]]
    ckpt = checkpoint.load(tmp_path / "b")  # weights_only load of what the run wrote
    assert ckpt["epoch"] == 2 and set(ckpt["node_state"]) == {"node_ids", "memory", "last_update", "mail", "mail_time"}


def test_resume_refuses_a_different_configuration(tmp_path, capsys):
    train(tmp_path, "a", "--model", "jodie", "--epochs", "1", "--checkpoint", str(tmp_path / "c"))
    rc = main(["train", *DATA, "--model", "tgn", "--epochs", "2", "--checkpoint", str(tmp_path / "c"), "--resume"])
    assert rc == 2 and "model=jodie" in capsys.readouterr().err


# DyRep's settings in DyGLib (utils/load_configs.py, train_link_prediction.py), the reference its
# defaults follow; TGN's, as its published UCI figure is met with them
DYGLIB_DYREP = {"memory_dim": 172, "lr": 1e-4, "patience": 20, "num_neighbors": 10}
TGN = {"memory_dim": 100, "lr": 1e-3, "patience": 5, "num_neighbors": 10}
SMALL = ["synthetic-temporal", "--num-nodes", "60", "--num-events", "600", "--batch-size", "100", "--quiet"]


def test_each_model_takes_its_defaults_and_a_setting_given_wins():
    for model, expected in (("dyrep", DYGLIB_DYREP), ("tgn", TGN)):
        cfg = LinkConfig(model=model)
        assert cfg.defaults == expected and {k: getattr(cfg, k) for k in expected} == expected
    cfg = LinkConfig(model="dyrep", lr=0.01, patience=None)  # None: the model's
    assert cfg.lr == 0.01 and cfg.patience == 20
    assert cfg.defaults == {k: v for k, v in DYGLIB_DYREP.items() if k != "lr"}
    assert dataclasses.replace(cfg, seed=1).defaults == cfg.defaults  # as --seeds makes each run's
    assert "memory_dim" not in dataclasses.replace(cfg, memory_dim=8).defaults
    assert cfg.to_dict()["lr"] == 0.01 and "defaults" not in cfg.to_dict()


def test_the_metrics_json_says_which_defaults_the_model_took(tmp_path):
    out = tmp_path / "m.json"
    assert main(["train", *SMALL, "--model", "dyrep", "--epochs", "1", "--memory-dim", "8", "--metrics-out",
                 str(out)]) == 0
    m = json.loads(out.read_text())
    took = {k: v for k, v in DYGLIB_DYREP.items() if k != "memory_dim"}
    assert m["defaults"] == took and all(m["config"][k] == v for k, v in took.items())
    assert m["config"]["memory_dim"] == 8


def test_resume_compares_the_settings_the_defaults_gave(tmp_path, capsys):
    """A checkpoint holds the settings the model's defaults gave: a flag of the same value resumes,
    another value is refused."""
    first = ["train", *SMALL, "--model", "dyrep", "--memory-dim", "8", "--checkpoint", str(tmp_path / "c")]
    assert main([*first, "--epochs", "1"]) == 0
    assert main([*first, "--epochs", "2", "--lr", "0.001", "--resume"]) == 2
    assert "lr=0.0001, this run has lr=0.001" in capsys.readouterr().err
    out = tmp_path / "m.json"
    assert main([*first, "--epochs", "2", "--lr", "0.0001", "--resume", "--metrics-out", str(out)]) == 0
    m = json.loads(out.read_text())
    assert [e["epoch"] for e in m["epochs"]] == [1, 2] and m["restarts"] and "lr" not in m["defaults"]


def test_checkpoint_rejects_pickled_objects(tmp_path):
    path = tmp_path / "x"
    path.mkdir()
    torch.save({"format": 1, "evil": object()}, path / checkpoint.checkpoint_name(1))
    with pytest.raises(Exception, match="cannot read checkpoint"):
        checkpoint.load(path)


def test_link_task_on_static_data_suggests_node(capsys):
    rc = main(["train", "synthetic-static", "--task", "link", "--num-nodes", "50", "--num-edges", "200", "--quiet"])
    assert rc == 2 and "--task node" in capsys.readouterr().err


def test_demo_prints_what_each_rank_held_and_moved_beside_one_process(tmp_path, capsys):
    out = tmp_path / "demo.json"
    assert main(["demo", "--num-nodes", "60", "--num-events", "1000", "--epochs", "1", "--quiet",
                 "--metrics-out", str(out)]) == 0
    m = json.loads(out.read_text())
    one = m["one_process"]
    assert (m["world_size"], m["memory"], m["config"]["cache"], one["world_size"]) == (2, "partitioned", "presample", 1)
    lines = capsys.readouterr().out.splitlines()
    parts = [[int(x.replace(",", "")) for x in re.fullmatch(
        r"  part \d: ([\d,]+) nodes, ([\d,]+) events from them, ([\d,]+) events touching them", ln).groups()]
        for ln in lines if ln.startswith("  part ")]
    # the partition covers the graph, and each rank holds its part: the events touching its nodes,
    # the memory of its nodes; the one process holds everything
    assert sum(p[0] for p in parts) == 60 and sum(p[1] for p in parts) == 1000
    assert [r["events_held"] for r in m["ranks"]] == [p[2] for p in parts]
    assert [r["node_state_rows"] for r in m["ranks"]] == [p[0] for p in parts]
    assert (one["ranks"][0]["events_held"], one["ranks"][0]["node_state_rows"]) == (1000, 60)
    table = lines[lines.index("what each rank held (cache counters: its last training epoch)"):]
    assert table[1].split() == ["rank", "0", "rank", "1", "1", "process"]
    rows = {ln[:26].strip(): ln[26:].split() for ln in table[2:] if ln[:26].strip()}
    ranks = m["ranks"] + one["ranks"]
    assert rows["events held"] == [f"{r['events_held']:,}" for r in ranks]
    assert rows["node-state rows"] == [f"{r['node_state_rows']:,}" for r in ranks]
    assert rows["MiB held"] == [f"{sum(r['bytes'].values()) / 2**20:.2f}" for r in ranks]
    assert rows["edge-cache hit rate"] == [f"{r['edge_cache']['hit_rate']:.2f}" for r in m["ranks"]] + ["-"]
    e = m["epochs"][-1]
    assert any(ln.startswith(f"moved between the 2 ranks in the last epoch: {e['remote_rows']:,} node-state rows "
                             f"({e['state_bytes'] / 2**20:.1f} MiB)") for ln in table)
    assert rows["2 ranks"] == [f"{m['test'][k]:.4f}" for k in ("ap", "auc", "mrr")]
    assert rows["1 process"] == [f"{one['test'][k]:.4f}" for k in ("ap", "auc", "mrr")]


def test_the_table_marks_figures_without_events():
    from gnndist.outputs import link_table as _table
    nan = float("nan")
    assert _table([("test new nodes (0 events)", {"ap": nan, "auc": nan, "mrr": nan})]).splitlines()[1].split() == [
        "test", "new", "nodes", "(0", "events)", "-", "-", "-"]


# ---------------------------------------------------------------- flags and configs (gnndist.validate)

@pytest.mark.parametrize("flags, fields", [
    (["--seed", "-1"], dict(seed=-1)),
    (["--seed", str(2**63)], dict(seed=2**63)),
    (["--lr", "nan"], dict(lr=float("nan"))),
    (["--lr", "0"], dict(lr=0.0)),
    (["--clip-grad", "inf"], dict(clip_grad=float("inf"))),
    (["--cache-size", "-0.5"], dict(cache_size=-0.5)),
    (["--memory-dim", "0"], dict(memory_dim=0)),
    (["--patience", "0"], dict(patience=0)),
    (["--batch-size", str(2**63)], dict(batch_size=2**63)),
    (["--memory", "spread"], dict(memory="spread")),
    (["--lr-schedule", "step"], dict(lr_schedule="step")),
    (["--sampling", "latest"], dict(sampling="latest")),
    (["--model", "jodie", "--sampling", "uniform"], dict(model="jodie", sampling="uniform")),
])
def test_a_config_built_in_python_fails_with_the_line_of_the_cli(flags, fields, capsys):
    with pytest.raises(GnndistError) as built:
        LinkConfig(**fields)
    with pytest.raises(GnndistError) as replaced:
        dataclasses.replace(LinkConfig(), **fields)
    assert str(built.value) == str(replaced.value)
    capsys.readouterr()
    try:
        rc = main(["train", *DATA, "--task", "link", *flags])
    except SystemExit as e:  # argparse's own choices
        rc = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    if flags[0] in ("--memory", "--lr-schedule", "--sampling"):  # argparse refuses these choices first
        assert flags[0] in err[0] and "invalid choice" in err[0]
    else:
        assert err[0] == f"gnndist train: error: {built.value}"


def test_the_edges_of_each_range_are_accepted():
    cfg = LinkConfig(seed=2**63 - 1, cache="degree", cache_size=0.0, clip_grad=1e-30, lr=1e300, patience=1,
                     batch_size=1)
    assert dataclasses.replace(cfg, seed=0).seed == 0
    for bad in (dict(seed=True), dict(epochs=2.0), dict(quiet=1), dict(lr="0.1"), dict(model="TGN")):
        with pytest.raises(GnndistError):
            LinkConfig(**bad)


# ---------------------------------------------------------------- what a trainer allocates (gnndist.footprint)

def small_events(edge_dim=3):
    rng = np.random.default_rng(0)
    e, n = 600, 30
    tg = TemporalGraph(rng.integers(0, n, e), rng.integers(0, n, e), np.sort(rng.random(e) * e),
                       rng.normal(size=(e, edge_dim)).astype(np.float32), num_nodes=n)
    return RankEvents.from_graph(tg)


def small_config(model, **kw):
    return LinkConfig(**{**dict(model=model, memory_dim=16, time_dim=8, num_neighbors=4, batch_size=40, quiet=True),
                         **kw})


def optimizer_bytes(params, optimizer) -> int:
    """Parameters, their gradients and the optimizer's per-parameter tensors, as allocated."""
    held = [p for p in params] + [p.grad for p in params if p.grad is not None]
    held += [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    return sum(t.nbytes for t in held)


@pytest.mark.parametrize("model", MODELS)
def test_the_footprint_is_what_a_link_trainer_allocates(model):
    """Model and node state: the bytes the trainer holds after a training epoch (a step's tensors
    and the steps planned ahead: bounded from above in tests/test_footprint.py)."""
    events, cfg = small_events(), small_config(model)
    parts = {p.label: p.nbytes for p in link_footprint(events, cfg).parts}
    tr = LinkTrainer(events, cfg)
    tr.train_epoch(1)
    held = optimizer_bytes(list(tr.model.parameters()), tr.optimizer)
    # DyRep's attention and the key weights of TGAT's first layer (whose keys are all the zero
    # input) get no gradient, so no Adam state: counted all the same
    if model in ("dyrep", "tgat"):
        assert held < parts["model with gradients and Adam state"]
    else:
        assert held == parts["model with gradients and Adam state"]
    state = [] if tr.state is None else [tr.state.memory, tr.state.last_update, tr.state.mail, tr.state.mail_time,
                                         tr.state.changed]
    assert parts["node state"] == sum(t.nbytes for t in state)


def test_a_link_setting_that_cannot_fit_is_refused_with_its_estimate(monkeypatch):
    events, cfg = small_events(), small_config("tgn")
    fp = link_footprint(events, cfg)
    need = sum(p.nbytes for p in fp.parts)
    monkeypatch.setattr(footprint, "available_memory_bytes", lambda: need)
    LinkTrainer(events, cfg)  # fits exactly
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two ranks on this host: twice the need
    with pytest.raises(GnndistError, match=re.escape(
            f"the tgn trainer needs an estimated {fmt_bytes(need)} of memory per rank, {fmt_bytes(2 * need)} "
            f"for the 2 ranks on this host ({fp.summary()}) but {fmt_bytes(need)} is available; lower --batch-size")):
        LinkTrainer(events, cfg)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setattr(footprint, "available_memory_bytes", lambda: need - 1)
    with pytest.raises(GnndistError, match="needs an estimated .* but .* is available; lower --batch-size"):
        LinkTrainer(events, cfg)
    big = small_config("tgn", memory_dim=4096)  # the model outgrows the batch
    with pytest.raises(GnndistError, match="lower --memory-dim$"):
        LinkTrainer(events, big)
    monkeypatch.setattr(footprint, "available_memory_bytes", lambda: None)  # unknown: nothing refused
    LinkTrainer(events, cfg)


def test_an_allocation_that_fails_anyway_is_one_line_naming_what_was_built(monkeypatch):
    events, cfg = small_events(), small_config("tgn")

    def fail(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 480259200000 bytes. Error code 12 (Cannot allocate memory)")
    monkeypatch.setattr(trainer_module, "build_model", fail)
    with pytest.raises(GnndistError) as e:
        LinkTrainer(events, cfg)
    assert str(e.value) == (f"not enough memory for the tgn trainer (estimated {link_footprint(events, cfg).summary()}): "
                            "DefaultCPUAllocator: can't allocate memory: you tried to allocate 480259200000 bytes. "
                            "Error code 12 (Cannot allocate memory)")
    monkeypatch.setattr(trainer_module, "build_model", lambda *a, **k: 1 / 0)  # not an allocation: unchanged
    with pytest.raises(ZeroDivisionError):
        LinkTrainer(events, cfg)


def test_the_cli_names_memory_the_data_generator_could_not_get(monkeypatch, capsys):
    import gnndist.datasets

    def huge(*args, **kwargs):
        np.empty(1 << 62, np.uint8)  # numpy's MemoryError: "Unable to allocate 4.00 EiB ..."
    monkeypatch.setattr(gnndist.datasets, "load", huge)
    assert main(["demo", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gnndist demo: error: not enough memory for gnndist demo: Unable to "
                                               "allocate 4.00 EiB for an array with shape (4611686018427387904,)")
