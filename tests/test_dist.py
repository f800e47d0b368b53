"""The distributed runtime on 2-3 local gloo ranks: exchanges, gathers, and failures that
end in a clear error instead of a hang."""
import os
import time

import pytest
import torch

from gnndist.launch import launch
from gnndist import GnndistError, dist


@pytest.fixture(autouse=True)
def short_timeout(monkeypatch):
    monkeypatch.setenv("GNNDIST_TIMEOUT", "5")


def exchange_worker():
    dist.setup("cpu")
    r, w = dist.rank(), dist.world_size()
    # rank r sends to rank p a (r + p)-row block whose entries encode (sender, receiver)
    got = dist.exchange([torch.full((r + p, 2), 10.0 * r + p) for p in range(w)])
    gathered = dist.all_gather_varsize(torch.arange(r + 1))
    return [g.tolist() for g in got], [g.tolist() for g in gathered], dist.agree_max(7 * r)


def test_exchange_gather_and_agree_on_three_ranks():
    out = launch(3, exchange_worker)
    for r, (got, gathered, agreed) in enumerate(out):
        assert got == [[[10.0 * s + r] * 2] * (s + r) for s in range(3)]
        assert gathered == [list(range(s + 1)) for s in range(3)]
        assert agreed == 14


def single_process_is_identity():
    assert dist.world_size() == 1
    x = torch.arange(4)
    return dist.exchange([x])[0] is x and dist.all_gather_varsize(x)[0] is x and dist.agree_max(3) == 3


def test_one_process_world_needs_no_group():
    assert single_process_is_identity()


def failing_worker():
    dist.setup("cpu")
    if dist.rank() == 1:
        raise GnndistError("partition 1 does not match")
    dist.agree_max(1)


def test_a_failing_rank_is_named_in_one_line():
    t0 = time.time()
    with pytest.raises(GnndistError) as e:
        launch(2, failing_worker)
    assert str(e.value) == "rank 1: partition 1 does not match"
    assert time.time() - t0 < 30


def stalling_worker():
    dist.setup("cpu")
    if dist.rank() == 1:
        time.sleep(60)
    dist.agree_max(1)


def test_a_stalled_rank_ends_in_a_timeout_not_a_hang():
    t0 = time.time()
    with pytest.raises(GnndistError, match="collective all_reduce.*died or stalled"):
        launch(2, stalling_worker)
    assert time.time() - t0 < 40
