"""`LinkConfig`: the settings of a link-prediction run (the CLI builds one from its flags)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional

from gnndist.errors import GnndistError

MODELS = ("tgn", "jodie", "apan", "dyrep", "tgat")
NEG_STRATEGIES = ("random", "historical", "inductive")
MEMORY_MODES = ("replicated", "partitioned")
SHARES = ("owner",)


@dataclass(frozen=True)
class LinkConfig:
    """Training and evaluation settings of a temporal link-prediction run (checked on creation)."""

    model: str = "tgn"
    epochs: int = 50
    patience: Optional[int] = 5  # stop after this many epochs without a better validation AP (None: never)
    batch_size: int = 200  # global: events per step over all ranks
    lr: float = 1e-3
    lr_schedule: str = "constant"  # constant | cosine (decay over `epochs`)
    clip_grad: Optional[float] = None  # global norm of the summed gradient
    memory_dim: int = 100
    time_dim: int = 100
    num_neighbors: int = 10
    mailbox: int = 10  # APAN's mails kept per node
    neg: str = "random"  # negatives of validation and test: random | historical | inductive
    eval_negatives: int = 10  # per positive, for MRR (AP and AUC use the first)
    memory: str = "replicated"  # node state across ranks: replicated | partitioned
    share: str = "owner"  # a rank processes the events whose source node it owns
    cache: str = "none"  # remote edge-feature cache: none | degree | presample | adaptive
    cache_size: float = 0.1  # a fraction (<= 1) of the remote events, or bytes (> 1)
    device: str = "cpu"
    seed: int = 0
    quiet: bool = False

    def __post_init__(self) -> None:
        choices = {"model": MODELS, "neg": NEG_STRATEGIES, "memory": MEMORY_MODES, "share": SHARES,
                   "cache": ("none", "degree", "presample", "adaptive"), "device": ("cpu", "cuda"),
                   "lr_schedule": ("constant", "cosine")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise GnndistError(f"--{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        for name in ("epochs", "batch_size", "memory_dim", "time_dim", "num_neighbors", "mailbox", "eval_negatives"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise GnndistError(f"--{name.replace('_', '-')} must be a positive integer, got {v!r}")
        if self.patience is not None and (not isinstance(self.patience, int) or self.patience < 1):
            raise GnndistError(f"--patience must be a positive integer, got {self.patience!r}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise GnndistError(f"--lr must be a finite number > 0, got {self.lr!r}")
        if self.clip_grad is not None and not (isinstance(self.clip_grad, (int, float)) and
                                               math.isfinite(self.clip_grad) and self.clip_grad > 0):
            raise GnndistError(f"--clip-grad must be a finite number > 0, got {self.clip_grad!r}")
        if not (isinstance(self.cache_size, (int, float)) and math.isfinite(self.cache_size) and self.cache_size >= 0):
            raise GnndistError(f"--cache-size must be a finite number >= 0, got {self.cache_size!r}")
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise GnndistError(f"--seed must be an integer from 0 to 2**63-1, got {self.seed!r}")

    def to_dict(self) -> dict:
        return asdict(self)
