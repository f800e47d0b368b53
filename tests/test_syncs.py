"""The training step never waits for the device more than 3 times (issue: a GPU-ready hot
loop): counted on the CPU by `SimulatedDevice` (tests/device_sim.py), which tracks which
tensors would live on a CUDA device and counts the operations that would make the host wait
for them. The sampling and the bookkeeping of rows run on host arrays, and the phase timers
use CUDA events; the one read-back left is the step's loss (APAN: and the grouping of its
delivered mails)."""
import warnings
from collections import Counter

import pytest
import torch

from device_sim import SimulatedDevice
from gnndist.runtime import dist as gdist
from gnndist.datasets import load
from gnndist.runtime.launch import launch
from gnndist.partition import partition_graph
from gnndist.temporal.config import MEMORY_MODES, LinkConfig
from gnndist.temporal.events import RankEvents
from gnndist.temporal.models import MODELS
from gnndist.temporal.fit import rank_events
from gnndist.temporal.trainer import LinkTrainer

MOST = 3


def simulated(trainer: LinkTrainer) -> SimulatedDevice:
    """A simulated device holding the trainer's model and node state, counting during its
    steps (batch construction, forward, backward, optimizer step, state write), the phase
    timers' waits for the device included."""
    sim = SimulatedDevice(trainer.device)
    trainer.halves = 1  # as on a device: each batch in one half
    wait = trainer.timers.wait

    def counted_wait():
        sim.syncs["Timers.wait"] += sim.counting
        wait()
    trainer.timers.wait = counted_wait
    sim.put_module(trainer.model)
    if trainer.state is not None:
        sim.put(*trainer.state.state.state_dict().values())
    during_steps(trainer, lambda on: setattr(sim, "counting", on))
    return sim


def during_steps(trainer: LinkTrainer, switch) -> None:
    """`switch(True)` as the trainer starts building a batch or stepping, `switch(False)` as it ends."""
    for name in ("batch", "step"):
        method = getattr(trainer, name)

        def counted(*args, _method=method):
            switch(True)
            try:
                return _method(*args)
            finally:
                switch(False)
        setattr(trainer, name, counted)


def test_the_simulated_device_counts_read_backs_and_data_sized_results():
    sim = SimulatedDevice(torch.device("cpu"))
    x = torch.arange(6.0)
    sim.put(x)
    host = torch.arange(6.0)
    with sim:
        sim.counting = True
        y = x * 2
        y.sum().item(), float(y[0]), y.cpu(), torch.unique(y), y[y > 2], torch.nonzero(y), y.tolist()
        host.sum().item(), host[host > 2], torch.unique(host)  # host data: nothing to wait for
        z = torch.zeros(3, device="cpu") + host.to("cpu")[:3]  # made on / moved to the device
        z.sum().item()
    assert sum(sim.syncs.values()) == 8


@pytest.mark.parametrize("model", MODELS)
def test_a_training_step_waits_for_the_device_at_most_three_times(model):
    tg = load("synthetic-temporal", num_nodes=60, num_events=1200, edge_dim=3)
    trainer = LinkTrainer(RankEvents.from_graph(tg), LinkConfig(model=model, memory_dim=16, time_dim=8,
                                                                 batch_size=100, quiet=True))
    sim = simulated(trainer)
    with sim:
        trainer.train_epoch(1)
    per_step = sum(sim.syncs.values()) / trainer.steps_per_epoch
    assert per_step <= MOST, dict(sim.syncs)
    assert per_step >= 1  # the loss is read back: the counter sees the device


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the count above runs everywhere)")
@pytest.mark.parametrize("model", MODELS)
def test_on_a_gpu_a_training_step_synchronizes_at_most_three_times(model, record_property):
    """The same count on a real GPU, by CUDA's own sync debug mode, which warns at every
    operation that makes the host wait for the device (the timers' waits counted apart)."""
    assert sync_warnings(watched_read_back)  # the mode sees a read-back
    tg = load("synthetic-temporal", num_nodes=60, num_events=1200, edge_dim=3)
    trainer = LinkTrainer(RankEvents.from_graph(tg), LinkConfig(model=model, memory_dim=16, time_dim=8,
                                                                 batch_size=100, quiet=True), torch.device("cuda"))
    inside, waits, wait = [False], [0], trainer.timers.wait

    def switch(on: bool) -> None:
        inside[0] = on
        torch.cuda.set_sync_debug_mode("warn" if on else "default")

    def counted_wait() -> None:
        waits[0] += inside[0]
        wait()
    trainer.timers.wait = counted_wait
    during_steps(trainer, switch)
    syncs = sync_warnings(lambda: trainer.train_epoch(1))
    per_step = (len(syncs) + waits[0]) / trainer.steps_per_epoch
    record_property("syncs_per_step", per_step)
    assert 1 <= per_step <= MOST, Counter(syncs)


def sync_warnings(run) -> list[str]:
    """Where CUDA's sync debug mode warned while `run()` ran."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [f"{w.filename}:{w.lineno}" for w in caught if "synchronizing" in str(w.message)]


def watched_read_back() -> None:
    torch.cuda.set_sync_debug_mode("warn")
    torch.ones(3, device="cuda").sum().item()
    torch.cuda.set_sync_debug_mode("default")


DISTRIBUTED = ("tgn", "apan", "dyrep")  # state writes, mail deliveries, parameters without gradients


def distributed_worker(store: str) -> dict:
    """Per (model, memory): this rank's waits per training step, and where they came from."""
    gdist.setup("cpu")
    try:
        out = {}
        for model in DISTRIBUTED:
            for memory in MEMORY_MODES:
                trainer = LinkTrainer(rank_events(store), LinkConfig(model=model, memory=memory, memory_dim=16,
                                                                     time_dim=8, batch_size=100, quiet=True))
                sim = simulated(trainer)
                with sim:
                    trainer.train_epoch(1)
                out[model, memory] = (sum(sim.syncs.values()) / trainer.steps_per_epoch, dict(sim.syncs))
        return out
    finally:
        gdist.teardown()


def test_a_distributed_training_step_waits_for_the_device_at_most_three_times(tmp_path):
    """2 ranks, replicated and partitioned memory: row counts of device payloads
    travel as host ints, and the states route and key rows by host arrays."""
    tg = load("synthetic-temporal", num_nodes=60, num_events=1200, edge_dim=3)
    partition_graph(tg, 2, method="temporal", out=tmp_path / "store")
    for rank, cases in enumerate(launch(2, distributed_worker, str(tmp_path / "store"))):
        for case, (per_step, syncs) in cases.items():
            assert 1 <= per_step <= MOST, (rank, case, syncs)
