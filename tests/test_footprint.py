"""The trainers' memory estimates (gnndist/static/footprint.py, gnndist/temporal/footprint.py)
bound what the trainers allocate: on small settings of every model, the most memory a run
holds at once while it builds its trainer, trains an epoch and evaluates (tests/allocations.py:
every tensor storage an operator makes, exactly, plus tracemalloc's host peak) is below the
estimate; and on two larger settings, so is the growth of the process's resident memory.
(That a setting beyond this machine is refused in one line: tests/test_bad_inputs.py.)"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from allocations import PeakMemory  # tests/ is on sys.path under pytest
from gnndist.datasets import load
from gnndist.graph import TemporalGraph
from gnndist.static.footprint import node_footprint
from gnndist.static.trainer import NodeConfig, NodeTrainer, WholeGraph
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.events import RankEvents
from gnndist.temporal.footprint import link_footprint
from gnndist.temporal.trainer import LinkTrainer

# The headroom an estimate must leave over the count: what the count does not see, the
# allocators' rounding and free lists (torch's CPU tensors and numpy's arrays come from malloc)
# and numba's arrays, must fit in it.
HEADROOM = 1.25
# How loose a bound may be: it counts every tensor of a step as held at once, each with a
# gradient, on the largest sample that the fanouts and degrees allow, so it is a few times what
# a step holds; a bound looser than this would refuse settings that fit.
LOOSEST = 8


@pytest.fixture(scope="module", autouse=True)
def counting_started():
    """The counting's own first use imports modules that tracemalloc would count."""
    with PeakMemory():
        torch.ones(2) * 2


def check_bound(fp, run) -> None:
    """`run()`'s peak (the trainer built inside it) with HEADROOM is at most the estimate `fp`,
    and the estimate at most LOOSEST times the peak."""
    with PeakMemory() as m:
        run()
    estimate = sum(p.nbytes for p in fp.parts)
    assert HEADROOM * m.total <= estimate <= LOOSEST * m.total, (m.tensors, m.host, fp.summary())


@pytest.fixture(scope="module")
def static_graph():
    g = load("synthetic-static", num_nodes=500, num_edges=3000)
    NodeTrainer(WholeGraph(g), NodeConfig.for_model("sage", hidden=4, quiet=True)).train_epoch(1)  # the
    # sampler's kernels loaded, which the first count would see
    return g


@pytest.mark.parametrize("model, settings", [
    ("sage", dict(hidden=512)), ("gcn", dict(hidden=512)), ("gat", dict(hidden=256, fanouts=[5, 5, 5])),
    ("sage", dict(hidden=64, batch_size=400, eval_fanouts=[3, 3]))])
def test_the_node_estimate_bounds_what_the_trainer_allocates(static_graph, model, settings):
    # one thread (the count sees no other); the estimate still counts a prefetched batch
    cfg = NodeConfig.for_model(model, epochs=1, quiet=True, prefetch=False, **settings)
    graph = WholeGraph(static_graph)

    def run():
        tr = NodeTrainer(graph, cfg)
        tr.train_epoch(1)
        tr.evaluate(graph.val_ids)

    check_bound(node_footprint(graph, cfg), run)


@pytest.fixture(scope="module")
def events():
    rng = np.random.default_rng(0)
    e, n = 1500, 150
    return RankEvents.from_graph(TemporalGraph(rng.integers(0, n, e), rng.integers(0, n, e), np.sort(rng.random(e) * e),
                                               rng.normal(size=(e, 8)).astype(np.float32), num_nodes=n))


@pytest.mark.parametrize("model", ["tgn", "jodie", "apan", "dyrep", "tgat"])
@pytest.mark.parametrize("settings", [dict(memory_dim=64, time_dim=16, num_neighbors=10, batch_size=100),
                                      dict(memory_dim=16, time_dim=8, num_neighbors=4, batch_size=300, eval_negatives=3)])
def test_the_link_estimate_bounds_what_the_trainer_allocates(events, model, settings):
    cfg = LinkConfig(model=model, epochs=1, quiet=True, **settings)

    def run():
        tr = LinkTrainer(events, cfg)
        tr.halves = 1  # in this process (the count sees no other); the estimate counts the second half's too
        tr.train_epoch(1)
        tr.evaluate(tr.train_end, tr.val_end, "val")

    check_bound(link_footprint(events, cfg), run)


# One run in a process of its own: the growth of its resident memory from before the trainer is
# built to its peak (the kernel's count: every allocator, every thread, the prefetched batch)
# against the estimate, on settings where a step's tensors are hundreds of MiB. A smaller run
# first compiles or loads numba's kernels (LLVM's memory on a cold cache is no trainer's), and
# the peak is counted from after it (/proc/self/clear_refs).
RESIDENT = """
import sys
import numpy as np
kind, model, width = sys.argv[1], sys.argv[2], int(sys.argv[3])
if kind == "node":
    from gnndist.datasets import load
    from gnndist.static.footprint import node_footprint
    from gnndist.static.trainer import NodeConfig, NodeTrainer, WholeGraph
    data = WholeGraph(load("synthetic-static", num_nodes=500, num_edges=3000))
    cfg = NodeConfig.for_model(model, hidden=width, epochs=1, quiet=True)
    fp = node_footprint(data, cfg)
else:
    from gnndist.graph import TemporalGraph
    from gnndist.temporal.config import LinkConfig
    from gnndist.temporal.events import RankEvents
    from gnndist.temporal.footprint import link_footprint
    from gnndist.temporal.trainer import LinkTrainer
    rng = np.random.default_rng(0)
    data = RankEvents.from_graph(TemporalGraph(rng.integers(0, 300, 3000), rng.integers(0, 300, 3000),
                                               np.sort(rng.random(3000) * 3000),
                                               rng.normal(size=(3000, 8)).astype(np.float32), num_nodes=300))
    cfg = LinkConfig(model=model, memory_dim=width, batch_size=600, epochs=1, quiet=True)
    fp = link_footprint(data, cfg)


def run(cfg):
    if kind == "node":
        tr = NodeTrainer(data, cfg)
        tr.train_epoch(1)
        tr.evaluate(data.val_ids)
    else:
        tr = LinkTrainer(data, cfg)
        tr.halves = 1  # the second half in this process too: the kernel counts this one only
        tr.train_epoch(1)
        tr.evaluate(tr.train_end, tr.val_end, "val")


def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


from dataclasses import replace
run(replace(cfg, **({"hidden": 4} if kind == "node" else {"memory_dim": 4})))  # numba's kernels compiled or loaded
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) from now on
before = status("VmRSS")
run(cfg)
print(status("VmHWM") - before, sum(p.nbytes for p in fp.parts))
"""


@pytest.mark.parametrize("kind, model, width", [("node", "gcn", 4000), ("link", "tgn", 512)])
def test_a_run_grows_by_less_than_its_estimate(kind, model, width):
    p = subprocess.run([sys.executable, "-c", RESIDENT, kind, model, str(width)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    grown, estimate = map(int, p.stdout.split())
    assert grown <= estimate <= LOOSEST * grown, (grown, estimate)
