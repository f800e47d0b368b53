"""`import gnndist` leaves no OpenMP thread spinning, imported before or after torch: measured
as the CPU time a fresh process burns while it sleeps right after torch's and the temporal
sampler's parallel regions, against the same process without gnndist (which spins). Numba's
parallel kernels leave torch's thread count as it was, and a job runs torch on
OMP_NUM_THREADS threads, else one, whichever was imported first."""
import json
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, os, sys, time
mode = sys.argv[1]
if mode == "torch-first":
    import torch, gnndist
elif mode == "gnndist-first":
    import gnndist, torch
else:
    import torch
import numpy as np
sample = lambda: None
if mode != "torch-only":
    import numba
    from gnndist.graph import TemporalGraph
    from gnndist.samplers import sample_tcsr
    rng = np.random.default_rng(0)
    tg = TemporalGraph(rng.integers(0, 500, 20000), rng.integers(0, 500, 20000), np.arange(20000.0), num_nodes=500)
    nodes, times = rng.integers(0, 500, 4000), rng.uniform(0, 20000, 4000)
    sample = lambda: sample_tcsr(*tg.tcsr(), nodes, times, 10)  # 40,000 slots: the parallel kernel
x = torch.randn(600, 600)
burn = 0.0
for _ in range(5):
    x @ x, (x + 1).sum(), sample()
    c = time.process_time()
    time.sleep(0.1)
    burn += time.process_time() - c
print(json.dumps({"burn": burn, "torch_threads": torch.get_num_threads(),
                  "layer": None if mode == "torch-only" else numba.threading_layer(),
                  "policy": os.environ.get("OMP_WAIT_POLICY")}))
"""


def run(mode, script=SCRIPT, **env):
    """`script`'s last printed line (JSON), run in a fresh process with only `env` of the thread
    variables set."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "NUMBA_THREADING_LAYER", "NUMBA_NUM_THREADS")}
    p = subprocess.run([sys.executable, "-c", script, mode], env={**clean, **env}, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def plain():
    """torch alone, as a user's script without gnndist runs it."""
    out = run("torch-only")
    if out["torch_threads"] < 2:
        pytest.skip("torch runs one thread here: no OpenMP team that could spin")
    assert out["burn"] > 0.01, out  # spinning teams: the measurement can see them
    return out


def test_gnndist_first_sleeps_idle_threads_and_keeps_torch_threads(plain):
    out = run("gnndist-first")
    assert out["burn"] < 0.005, out
    assert out["policy"] == "PASSIVE" and out["layer"] == "omp"
    assert out["torch_threads"] == plain["torch_threads"]


def test_torch_first_runs_no_spinning_team(plain):
    out = run("torch-first")
    assert out["burn"] < 0.005, out
    assert out["torch_threads"] == 1 and out["layer"] == "workqueue"


def test_explicit_settings_win(plain):
    out = run("torch-first", OMP_WAIT_POLICY="ACTIVE")
    assert out["policy"] == "ACTIVE" and out["layer"] == "omp"
    assert out["torch_threads"] == plain["torch_threads"]
    out = run("torch-first", OMP_NUM_THREADS="2")
    assert out["torch_threads"] == 2 and out["layer"] == "workqueue"


def test_numba_pool_keeps_torch_thread_count(plain):
    # starting numba's OpenMP pool used to set torch's count to numba's (2 here)
    out = run("gnndist-first", OMP_NUM_THREADS="1")
    assert out["layer"] == "omp" and out["torch_threads"] == 1, out


IMPORTED = r"""
import json, sys
if sys.argv[1] == "torch-first":
    import torch, gnndist
else:
    import gnndist, torch
"""  # in the order the mode says

JOB = IMPORTED + r"""
from gnndist.datasets.generators import synthetic_temporal
from gnndist.temporal import fit, trainer
seen = []
epoch = trainer.LinkTrainer.train_epoch
def spy(self, *a):  # numba's parallel sampling kernel ran when the trainer was built, and runs in the epoch
    out = epoch(self, *a)
    seen.append(torch.get_num_threads())
    return out
trainer.LinkTrainer.train_epoch = spy
torch.set_num_threads(2)
fit.train_link(synthetic_temporal(200, 3000, 4, seed=0), fit.LinkConfig(epochs=1, quiet=True))
print(json.dumps({"in_job": seen, "after": torch.get_num_threads()}))
"""



@pytest.mark.parametrize("mode", ["gnndist-first", "torch-first"])
def test_a_job_runs_torch_on_one_thread_unless_told(plain, mode):
    assert run(mode, JOB) == {"in_job": [1], "after": 2}
    assert run(mode, JOB, OMP_NUM_THREADS="2") == {"in_job": [2], "after": 2}


DIRECT = IMPORTED + r"""
from gnndist.datasets.generators import synthetic_temporal
from gnndist.temporal.config import LinkConfig
from gnndist.temporal.fit import rank_events
from gnndist.temporal.trainer import LinkTrainer
torch.set_num_threads(2)
tr = LinkTrainer(rank_events(synthetic_temporal(200, 3000, 4, seed=0)), LinkConfig(epochs=1, quiet=True))
seen = set()  # torch's count at each forward pass run here (the half process's are its own)
tr.model.register_forward_pre_hook(lambda module, args: seen.add(torch.get_num_threads()))
tr.train_epoch(1)
tr.evaluate(tr.train_end, tr.val_end, "val")
print(json.dumps({"halves": tr.halves, "in_epochs": sorted(seen), "after": torch.get_num_threads()}))
"""


STATIC_DIRECT = IMPORTED + r"""
from gnndist.datasets.generators import synthetic_static
from gnndist.static.config import NodeConfig
from gnndist.static.trainer import NodeTrainer, WholeGraph
torch.set_num_threads(2)
tr = NodeTrainer(WholeGraph(synthetic_static(300, 1500, 8, seed=0)), NodeConfig(epochs=1, quiet=True))
seen = set()
tr.model.register_forward_pre_hook(lambda module, args: seen.add(torch.get_num_threads()))
tr.train_epoch(1)
tr.evaluate(tr.graph.val_ids)
print(json.dumps({"in_epochs": sorted(seen), "after": torch.get_num_threads()}))
"""


@pytest.mark.parametrize("mode", ["gnndist-first", "torch-first"])
def test_a_trainer_a_script_runs_itself_runs_as_in_a_job(plain, mode):
    """A script that builds `LinkTrainer` (or `NodeTrainer`) and runs its epochs without
    `train_link` gets what a job gets: torch on one thread in its epochs and evaluations (unless
    OMP_NUM_THREADS says otherwise), its count back afterwards, and two halves a step where 2
    cores are there."""
    two = len(os.sched_getaffinity(0)) >= 2
    assert run(mode, DIRECT) == {"halves": 2 if two else 1, "in_epochs": [1], "after": 2}
    assert run(mode, DIRECT, OMP_NUM_THREADS="2") == {"halves": 1, "in_epochs": [2], "after": 2}
    assert run(mode, STATIC_DIRECT) == {"in_epochs": [1], "after": 2}  # the static trainer's too


THREADS_SCRIPT = r"""
import ctypes, json, threading
import gnndist, torch
from gnndist.samplers.loader import PrefetchLoader
torch.set_num_threads(1)
gomp = next(line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line)
max_threads = ctypes.CDLL(gomp).omp_get_max_threads  # what a matrix product in this thread uses
out = {}
raw = threading.Thread(target=lambda: out.update(plain_thread=max_threads()))
raw.start(), raw.join()
out["prefetch"] = next(iter(PrefetchLoader([0], lambda _: max_threads())))
print(json.dumps(out))
"""


def test_threads_gnndist_starts_run_torch_on_its_thread_count():
    """OpenMP's thread count is per thread: a thread started plainly gets the runtime's default
    (every core) for its matrix products whatever torch was set to; the prefetch thread takes
    torch's count (a step's half process: `test_half_process`)."""
    got = run("gnndist-first", THREADS_SCRIPT)
    assert got["prefetch"] == 1
    if len(os.sched_getaffinity(0)) > 1:
        assert got["plain_thread"] > 1  # what they would run on without `torch_threads_here`
