"""Which code issues each collective, on which process group: a recorder for the multi-rank
tests. Under NCCL (`--device cuda`) the default group may carry only device tensors, so every
host-side exchange (sampled neighbours, feature rows, negatives, counters of numpy data) must
go on the samplers' gloo group; `DEVICE_SITES` are the places that exchange device tensors
(gradients, node-state rows, embeddings, metrics built on the trainer's device), each a
"folder/file.py" of the package and the names of functions in it (tests/test_structure.py checks
that the file has them)."""
import sys
from pathlib import Path

import torch.distributed as tdist

from gnndist.runtime import dist as gdist

DEVICE_SITES = {
    "temporal/trainer.py": {"__init__", "forward", "step"},
    "temporal/fit.py": {"selected_test_metrics"},
    "gnndist/resume.py": {"_all", "_common", "find", "_steps_run", "resumed", "_due"},
    "temporal/traffic.py": {"epoch_traffic", "rank_metrics"},
    "temporal/dist_state.py": {"_gather", "_to_owners", "_answer"},
    "static/trainer.py": {"__init__", "min_feature", "_batches", "compute_grads", "evaluate", "_global_counters"},
}


def record_sites() -> list[tuple[str, bool]]:
    """From now on in this process, record every collective as (site, on the default group),
    the site being "folder/file.py:function" of the code that called `gnndist.runtime.dist`."""
    seen, check, here = [], gdist._on_device, gdist.__file__

    def recording(op, t, group):
        frame = sys._getframe(1)
        while frame.f_code.co_filename == here:
            frame = frame.f_back
        path = Path(frame.f_code.co_filename)
        seen.append((f"{path.parent.name}/{path.name}:{frame.f_code.co_name}", group is None or group is tdist.group.WORLD))
        check(op, t, group)

    gdist._on_device = recording
    return seen


def off_device_sites(seen: list[tuple[str, bool]]) -> set[str]:
    """The recorded sites of the library that used the default group but are no device site
    (the tests' own gathers are left out)."""
    out = set()
    for site, default in seen:
        file, function = site.split(":")
        if default and not file.startswith("tests/") and function not in DEVICE_SITES.get(file, ()):
            out.add(site)
    return out
