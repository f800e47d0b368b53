"""Partitioning shard files across ranks (`gnndist.partition.scale`), against one process: W = 2
and 3 ranks write stores identical to `partition_graph`'s on the loaded graph (every array
file byte for byte, meta.json apart from its timing and memory metrics), whatever the order of
the shards; label propagation reaches a cut near METIS's within its balance, the same on any
number of ranks; no rank holds an array that grows with the whole graph; under a memory budget
its part is spilled in sorted runs and merged into the same store, the runs removed even where a
rank fails; bad shards stop every rank with one line and leave no store."""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from gnndist.cli import main
from gnndist.datasets import load
from gnndist.datasets.shard_writer import ShardWriteConfig, write_shards
from gnndist.errors import GnndistError
from gnndist.graph import TemporalGraph
from gnndist.partition import partition_graph, scale
from gnndist.runtime import dist
from gnndist.runtime.launch import launch

UCI = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "uci_collegemsg" / "CollegeMsg.txt.gz"
RUN_METRICS = ("partition_time_s", "peak_memory_bytes", "write_time_s", "ranks")


def comparable(store: Path) -> dict:
    """meta.json without what differs between runs (timing, memory, the per-rank run metrics)."""
    meta = json.loads((store / "meta.json").read_text())
    meta.pop("meta_sha256")
    for key in RUN_METRICS:
        meta["stats"].pop(key, None)
    return meta


def communities(n: int = 240, e: int = 6000, groups: int = 4, inside: float = 0.8, seed: int = 0) -> TemporalGraph:
    """Events of which `inside` have both endpoints in one of `groups` communities (node % groups)."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n, e)
    near = rng.random(e) < inside
    other = rng.integers(0, n // groups, e) * groups + src % groups
    dst = np.where(near, other, rng.integers(0, n, e))
    return TemporalGraph(src, dst, np.sort(rng.random(e)) * 1e6, rng.normal(size=(e, 3)).astype(np.float32),
                         rng.integers(0, 2, e), num_nodes=n)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Shard folders: a temporal graph with edge features and labels in time order (parquet) and
    out of it (csv, shuffled rows and ids); a static graph with features, labels and a split; and
    a temporal graph of 40 nodes, whose 6,000 events repeat their node pairs."""
    root = tmp_path_factory.mktemp("shards")
    tg = communities(seed=1)
    g = load("synthetic-static", num_nodes=300, num_edges=2000, seed=2)
    out = {"temporal": root / "temporal", "shuffled": root / "shuffled", "static": root / "static",
           "repeated": root / "repeated"}
    write_shards(tg, out["temporal"], ShardWriteConfig(num_shards=3, format="parquet"))
    write_shards(communities(n=40, seed=3), out["repeated"], ShardWriteConfig(num_shards=2, format="parquet"))
    write_shards(tg, out["shuffled"], ShardWriteConfig(num_shards=3, format="csv", out_of_time_order=True))
    write_shards(g, out["static"], ShardWriteConfig(num_shards=3, format="csv"))
    return {k: str(v) for k, v in out.items()}


CASES = [("temporal", "random"), ("temporal", "temporal"), ("temporal", "metis"), ("shuffled", "temporal"),
         ("temporal", "temporal-lp"), ("static", "random"), ("static", "metis"), ("static", "metis-lp")]


def arrays_in(obj, seen=None) -> list[np.ndarray]:
    """Every numpy array reachable from `obj`'s attributes, dicts, lists and tuples."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return [obj] if not isinstance(obj, np.memmap) else []
    items = (list(obj.values()) if isinstance(obj, dict) else list(obj) if isinstance(obj, (list, tuple))
             else list(vars(obj).values()) if hasattr(obj, "__dict__") and not isinstance(obj, type) else [])
    return [a for x in items for a in arrays_in(x, seen)]


def held_bytes(obj) -> int:
    """Bytes of the arrays reachable from `obj`, a view counted as the whole array it views."""
    roots = {}
    for a in arrays_in(obj):
        while isinstance(a.base, np.ndarray):
            a = a.base
        roots[id(a)] = a.nbytes
    return sum(roots.values())


BUDGET = 64 << 10  # bytes: the out-of-core cases' --memory-budget; a part of the communities graph is 2-4x it
SPILLED = [("temporal", "random"), ("shuffled", "random")]
# over METIS's estimate for the communities graph's projection (4,534 pairs: 773 KB), over label
# propagation's for its largest rank's share at W = 2 and 3 (some 600 and 400 KB)
SWITCH = 704 << 10
TINY = 16 << 10  # under both


class Injected(GnndistError):
    pass


def worker(shards, root):
    """Every case on this rank; what each wrote, and the longest array the rank held at each
    phase's end with the sizes of its portion; the out-of-core cases (`SPILLED` under `BUDGET`),
    with the most bytes the part's runs held at once, how many runs were spilled and the spill
    files seen; and one of them failed by rank 1 half-way through the merge."""
    dist.setup("cpu")
    peak, spilled, in_memory = {}, {}, {}

    def held(job, phase):
        key = job.data, job.method, phase, job.budget
        if job.runs is not None:
            was = spilled.get(key, (0, 0, set()))
            files = set(os.listdir(job.runs.folder)) if job.runs.folder.exists() else set()
            spilled[key] = max(was[0], held_bytes(job.runs)), len(job.runs.runs), was[2] | files
            if job.runs.heads:  # a block of the merge: the runs' rows alone
                return
        longest = max((a.shape[0] for a in arrays_in(job) if a.ndim), default=0)
        portion = max(job.portion.rows if job.portion else 0, job.pairs[0].size if job.pairs else 0,
                      job.entries[0].size if job.entries else 0, job.runs.rows if job.runs else 0,
                      max((a.shape[0] for a in (getattr(job, "part", None) or {}).values()), default=0))
        peak[key] = max(peak.get(key, (0, 0, 0)), (longest, portion, 0 if job.ids is None else job.ids.size))
        if job.portion is not None:
            in_memory[key] = max(in_memory.get(key, 0), held_bytes(job.portion))

    scale.held = held
    out = {}
    try:
        for name, method in CASES:
            dest = Path(root) / f"w{dist.world_size()}-{name}-{method}"
            scale.partition_shards(shards[name], dist.world_size(), method=method, out=dest)
            out[name, method] = str(dest)
        for name, method in SPILLED:
            dest = Path(root) / f"w{dist.world_size()}-{name}-{method}-spilled"
            scale.partition_shards(shards[name], dist.world_size(), method=method, memory_budget=BUDGET, out=dest)
            out[name, method, "spilled"] = str(dest)
        writes = []

        def failing(job, phase):
            held(job, phase)
            writes.append(phase == "write")
            if dist.rank() == 1 and sum(writes) == 3:
                raise Injected("injected: the disk is full")

        scale.held = failing
        try:
            scale.partition_shards(shards["temporal"], dist.world_size(), method="random", memory_budget=BUDGET,
                                   out=Path(root) / "failed")
        except GnndistError as e:
            out["failed"] = str(e), sum(writes)
        scale.held = held
        try:  # explicit METIS over the budget: refused; the default: label propagation
            scale.partition_shards(shards["temporal"], dist.world_size(), method="temporal", memory_budget=TINY,
                                   out=Path(root) / "refused")
        except GnndistError as e:
            out["refused"] = str(e)
        out["switched"] = scale.partition_shards(shards["temporal"], dist.world_size(), memory_budget=SWITCH,
                                                 out=Path(root) / f"w{dist.world_size()}-switched")["method"]
        try:  # neither METIS nor the largest rank's share fits: refused
            scale.partition_shards(shards["temporal"], dist.world_size(), memory_budget=TINY, out=Path(root) / "none")
        except GnndistError as e:
            out["lp_refused"] = str(e)
    finally:
        dist.teardown()
    return out, peak, spilled, in_memory


@pytest.fixture(scope="module", params=[2, 3])
def launched(request, shards, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"w{request.param}")
    results = launch(request.param, worker, shards, str(root))
    return request.param, root, results


def test_stores_of_w_ranks_equal_one_process_s(launched, shards, tmp_path):
    """Every array file and id map byte for byte (meta.json's checksums) and meta.json but its
    timing and memory metrics; shards out of time order (shuffled rows, other node ids in the
    files) give the store of the ones in order."""
    w, _, results = launched
    for name, method in CASES:
        one = tmp_path / f"one-{name}-{method}"
        partition_graph(load(shards[name]), w, method=method, out=one)
        got = Path(results[0][0][name, method])
        assert comparable(got) == comparable(one), (name, method)
        for f in json.loads((got / "meta.json").read_text())["files"]:
            assert (got / f).read_bytes() == (one / f).read_bytes(), (name, method, f)
    shuffled = comparable(Path(results[0][0]["shuffled", "temporal"]))
    assert shuffled == comparable(Path(results[0][0]["temporal", "temporal"]))


def test_parts_spilled_in_sorted_runs_make_one_process_s_store(launched, shards, tmp_path):
    """Under a budget a quarter of a part, each rank keeps the events it read in files, ranks
    their keys in several rounds, spills its part in several sorted runs and merges them as it
    writes: every array file byte for byte one process's, the spilled files gone afterwards; the
    rows of the part the rank held at once stayed within the budget, and at the end of every phase
    it held none of the events it read in memory."""
    w, root, results = launched
    for name, method in SPILLED:
        one = tmp_path / f"one-{name}-{method}"
        partition_graph(load(shards[name]), w, method=method, out=one)
        got = Path(results[0][0][name, method, "spilled"])
        assert comparable(got) == comparable(one), (name, method)
        meta = json.loads((got / "meta.json").read_text())
        for f in meta["files"]:
            assert (got / f).read_bytes() == (one / f).read_bytes(), (name, method, f)
        assert all(r["runs_spilled"] >= 3 and r["bytes_spilled"] > BUDGET for r in meta["stats"]["ranks"])
        assert all(r["portion_bytes_spilled"] > BUDGET and r["sort_rounds"] >= 3 for r in meta["stats"]["ranks"])
        for _, _, spilled, in_memory in results:
            assert [v for k, v in in_memory.items() if k[:2] == (shards[name], method) and k[3] == BUDGET] == [0] * 7
            runs = {k[2]: v for k, v in spilled.items() if k[:2] == (shards[name], method) and k[3] == BUDGET}
            assert runs["write"][1] >= 3 and len(runs["write"][2]) >= 3, runs  # runs spilled, their files seen
            assert max(most for most, _, _ in runs.values()) <= BUDGET, runs
    assert not [p for p in root.iterdir() if ".runs-" in p.name]


@pytest.mark.parametrize("name, method, budget", [("shuffled", "random", BUDGET), ("repeated", "temporal", 4 * BUDGET)])
def test_one_process_under_a_budget_writes_the_store_it_writes_in_memory(shards, tmp_path, name, method, budget):
    """One rank (a workstation) under a budget far below its events: the events it read in files,
    their keys ranked in rounds, the projection (`temporal`, whose METIS fits the budget) built a
    block at a time, the part merged from runs; the store is `partition_graph`'s and nothing
    spilled is left."""
    one = tmp_path / "one"
    partition_graph(load(shards[name]), 1, method=method, out=one)
    got = tmp_path / "ooc"
    meta = scale.partition_shards(shards[name], 1, method=method, memory_budget=budget, out=got)
    (r,) = meta["stats"]["ranks"]
    assert r["portion_bytes_spilled"] > budget // 4 and r["sort_rounds"] >= 3 and r["runs_spilled"] >= 3, r
    assert comparable(got) == comparable(one)
    for f in meta["files"]:
        assert (got / f).read_bytes() == (one / f).read_bytes(), f
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "ooc"]


def test_a_rank_that_fails_mid_merge_leaves_no_runs_and_no_store(launched):
    w, root, results = launched
    for out, *_ in results:
        error, writes = out["failed"]
        assert error == "injected: the disk is full" and writes >= 3
    assert not (root / "failed").exists()
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # neither runs nor a half-written store


def test_the_run_metrics_of_every_rank_are_in_meta_json(launched, shards):
    w, _, results = launched
    meta = json.loads((Path(results[0][0]["temporal", "temporal"]) / "meta.json").read_text())
    ranks = meta["stats"]["ranks"]
    assert [r["rank"] for r in ranks] == list(range(w))
    assert all(r["bytes_read"] > 0 and r["bytes_sent"] > 0 and r["bytes_received"] > 0 for r in ranks)
    assert sum(r["bytes_read"] for r in ranks) == sum(p.stat().st_size for p in Path(shards["temporal"]).rglob("*.parquet"))
    assert all(set(r["seconds"]) == set(scale.PHASES) and r["peak_memory_bytes"] > 0 for r in ranks)
    assert all(r["sort_rounds"] == 1 for r in ranks)  # within the default budget
    # only rank 0's events went to files: while it ran METIS on the gathered projection
    assert ranks[0]["portion_bytes_spilled"] > 0 and all(r["portion_bytes_spilled"] == 0 for r in ranks[1:])
    for r in ranks:  # the peak so far at the end of each phase before the write (meta.json is written in it)
        peaks = r["peak_memory_bytes_by_phase"]
        assert list(peaks) == list(scale.PHASES[:-1]) and list(peaks.values()) == sorted(peaks.values()), peaks
        assert 0 < peaks["route"] <= r["peak_memory_bytes"]


def test_a_budget_too_small_for_metis_refuses_it_or_runs_label_propagation(launched):
    _, _, results = launched
    for out, *_ in results:
        assert out["refused"].startswith("--method temporal runs METIS on one rank, which needs an estimated ")
        assert out["refused"].endswith("but --memory-budget is 16.0 KiB: use --method temporal-lp, or a larger budget")
        assert out["switched"] == "temporal-lp"
        assert out["lp_refused"].startswith("--method temporal-lp holds the projection's 4,534 node pairs across the "
                                            "ranks, an estimated "), out["lp_refused"]
        assert out["lp_refused"].endswith(f"rank(s), but --memory-budget is 16.0 KiB: {-(-4534 * 256 // TINY):,} ranks "
                                          "would hold it (or use --method random)"), out["lp_refused"]


def test_no_rank_holds_an_array_per_event_or_edge_of_the_whole_graph(launched, shards):
    """At the end of every phase, the longest array a rank holds is bounded by its portion (the
    events or edges it read, its pairs, its part) or the node count; with 3 ranks that is well
    under the whole graph's events."""
    w, _, results = launched
    events = load(shards["temporal"]).num_events
    for _, peak, *_ in results:
        for (data, method, phase, _), (longest, portion, nodes) in peak.items():
            assert longest <= max(portion, nodes), (data, method, phase, longest, portion, nodes)
            if w == 3 and "temporal" in data:
                assert longest < 0.8 * events, (data, method, phase, longest)


@pytest.mark.skipif(not UCI.exists(), reason="shared datasets absent")
@pytest.mark.parametrize("parts", [4, 8])
def test_label_propagation_cuts_near_metis_within_its_balance(parts):
    """UCI and a graph whose communities hold 80% of the events: temporal-lp's cross-part event
    fraction is at most 1.5x METIS's and well below random's, and each balance constraint within
    METIS's own result + 0.05."""
    for g in (load(str(UCI)), communities(n=400, e=20000)):
        got = {m: partition_graph(g, parts, method=m).stats for m in ("temporal-lp", "temporal", "random")}
        lp, metis, rnd = (got[m]["cross_partition_event_fraction"] for m in ("temporal-lp", "temporal", "random"))
        assert lp <= 1.5 * metis and lp < 0.85 * rnd, (parts, lp, metis, rnd)
        for key in ("events", "events_worst_window"):
            assert got["temporal-lp"]["imbalance"][key] <= got["temporal"]["imbalance"][key] + 0.05, (parts, key, got)


def test_label_propagation_is_the_same_for_a_seed_and_differs_between_seeds():
    g = communities(n=400, e=20000)
    a, b, c = (partition_graph(g, 4, method="temporal-lp", seed=s).membership for s in (3, 3, 4))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def _shard_cli(data, out, *more, nproc="2"):
    return ["partition", str(data), "--parts", "2", "--out", str(out), "--nproc", nproc, "--quiet", *more]


def test_the_default_method_says_it_runs_label_propagation_over_the_budget(shards, tmp_path, capfd):
    assert main(_shard_cli(shards["temporal"], tmp_path / "s", "--memory-budget", "704KiB")) == 0
    err = capfd.readouterr().err
    assert "partition: temporal-lp, since METIS on one rank would need an estimated " in err
    assert json.loads((tmp_path / "s" / "meta.json").read_text())["method"] == "temporal-lp"


def _damaged(shards, tmp_path, how):
    folder = tmp_path / "bad"
    shutil.copytree(shards["temporal"] if how != "row" else shards["shuffled"], folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in (".csv", ".parquet"))
    if how == "header":
        tg = communities(seed=1)
        write_shards(TemporalGraph(tg.src[:50], tg.dst[:50], tg.t[:50], num_nodes=tg.num_nodes), tmp_path / "other",
                     ShardWriteConfig(num_shards=1, format="parquet"))
        (other,) = (tmp_path / "other").rglob("*.parquet")
        shutil.copy(other, files[1])
        return folder, files[1].name
    lines = files[2].read_text().splitlines()
    lines[4] = "1,2,not-a-number"
    files[2].write_text("\n".join(lines) + "\n")
    return folder, f"{files[2]}:5"


@pytest.mark.parametrize("how", ["header", "row"])
def test_bad_shards_stop_every_rank_with_one_line_and_leave_no_store(shards, tmp_path, capfd, how):
    folder, named = _damaged(shards, tmp_path, how)
    out = tmp_path / "store"
    partition_graph(load("synthetic-temporal", num_nodes=50, num_events=600), 2, out=out)  # an earlier store
    before = (out / "meta.json").read_bytes()
    assert main(_shard_cli(folder, out)) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gnndist partition: error: ") and named in err[0], err
    assert (out / "meta.json").read_bytes() == before  # the earlier store is as it was
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".store.")]  # nothing half-written beside it


def _per_host(shards, root):
    """Rank r's own folder of shard files (as hosts that do not share a file system)."""
    files = sorted(p for p in Path(shards["temporal"]).rglob("*.parquet"))
    mine = Path(root) / f"host{dist.rank()}"
    mine.mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(files):
        if i % 2 == dist.rank():
            shutil.copy(f, mine / f.name)
    return str(mine)


def hosts_worker(shards, root):
    dist.setup("cpu")
    os.environ.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")  # each rank the first of a host of its own
    try:
        data = _per_host(shards, root)
        dist.agree_max(0)
        scale.partition_shards(data, 2, method="temporal", out=Path(root) / f"store{dist.rank()}")
        return sorted(os.listdir(Path(root) / f"store{dist.rank()}"))
    finally:
        dist.teardown()


def test_ranks_that_each_see_only_their_own_shards_partition_together(shards, tmp_path):
    """Each rank reads the files of its own folder (as two hosts do), writes its own folder's
    store: meta.json, the id maps and its own part only, and the metadata is one process's."""
    listed = launch(2, hosts_worker, shards, str(tmp_path))
    assert listed == [["meta.json", "orig_to_new.npy", "part0"], ["meta.json", "orig_to_new.npy", "part1"]]
    one = tmp_path / "one"
    partition_graph(load(shards["temporal"]), 2, method="temporal", out=one)
    for r in range(2):
        assert comparable(tmp_path / f"store{r}") == comparable(one)


def test_training_on_shard_files_partitions_them_across_its_ranks_first(shards, tmp_path, monkeypatch):
    """`gnndist train SHARDS --nproc 2` partitions with 2 ranks (into the cache) and trains on
    that store: the metrics of training on the store one process writes."""
    monkeypatch.setenv("GNNDIST_CACHE", str(tmp_path / "cache"))
    store = tmp_path / "one"
    partition_graph(load(shards["temporal"]), 2, method="temporal", out=store)
    argv = ["--task", "link", "--memory-dim", "8", "--batch-size", "200", "--epochs", "1", "--quiet", "--nproc", "2"]
    assert main(["train", shards["temporal"], *argv, "--metrics-out", str(tmp_path / "shards.json")]) == 0
    assert main(["train", str(store), *argv, "--metrics-out", str(tmp_path / "store.json")]) == 0
    (made,) = (tmp_path / "cache" / "partitions").iterdir()
    assert comparable(made) == comparable(store)
    got, want = (json.loads((tmp_path / f).read_text()) for f in ("shards.json", "store.json"))
    assert got["test"] == pytest.approx(want["test"], abs=1e-9)
