"""TensorBoard event files of a training run (`gnndist train ... --log-dir DIR`), written by
rank 0 with `torch.utils.tensorboard`:

- `train/loss`: the global loss of every training step (x: the step count from the first
  epoch's first step, so a resumed run continues the curve);
- `epoch/KEY`: every number of the epoch's record (the one the metrics JSON lists under
  "epochs"; x: the epoch);
- `test/KEY`: every number of the test metrics (x: the selected epoch).

Needs the `tensorboard` package (`pip install 'gnndist[plot]'`). A run adds one event file to
DIR; give each run its own folder to see them apart in TensorBoard.
"""
from __future__ import annotations

import math
import weakref
from typing import Any, Iterator, Optional

from gnndist.errors import GnndistError


def require_tensorboard() -> None:
    """A one-line GnndistError unless `torch.utils.tensorboard` can be imported."""
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        raise GnndistError("--log-dir needs the tensorboard package: pip install 'gnndist[plot]' "
                           "(or pip install tensorboard)") from None


def numbers(record: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """(key, value) of every finite int or float in `record`, nested dicts as 'outer/inner'
    (booleans, None, strings and lists left out)."""
    for key, value in record.items():
        if isinstance(value, dict):
            yield from numbers(value, f"{prefix}{key}/")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            yield f"{prefix}{key}", float(value)


class RunLog:
    """The TensorBoard writer of one run; with `log_dir` None (no --log-dir, or a rank other than
    0) every method does nothing, so the trainers call it unconditionally."""

    def __init__(self, log_dir: Optional[str], first_step: int = 0) -> None:
        self.steps = first_step
        self.writer = None
        if log_dir:
            require_tensorboard()
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir)
            # flushed and closed at exit too, so a run that fails keeps the steps it logged
            self._close = weakref.finalize(self, self.writer.close)

    def step(self, loss: float) -> None:
        """Log one training step's loss."""
        if self.writer is not None:
            self.writer.add_scalar("train/loss", loss, self.steps)
        self.steps += 1

    def epoch(self, record: dict[str, Any]) -> None:
        """Log every number of an epoch's record (its "epoch" key is the x value)."""
        self._scalars("epoch", {k: v for k, v in record.items() if k != "epoch"}, record["epoch"])

    def test(self, metrics: dict[str, Any], epoch: int) -> None:
        """Log the test metrics of the parameters selected at `epoch`, and close the file."""
        self._scalars("test", metrics, epoch)
        self.close()

    def close(self) -> None:
        if self.writer is not None:
            self._close()

    def _scalars(self, group: str, record: dict[str, Any], x: int) -> None:
        if self.writer is None:
            return
        for key, value in numbers(record):
            self.writer.add_scalar(f"{group}/{key}", value, x)
        self.writer.flush()
