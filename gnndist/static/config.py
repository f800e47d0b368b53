"""`NodeConfig`: the settings of a node-classification run (the CLI builds one from its flags)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Optional

from gnndist.errors import GnndistError
from gnndist.validate import COMMON, FLAG, Fanouts, Int, OneOf, Real, check, check_cache, check_fields, take_defaults

MODELS = ("sage", "gcn", "gat")
# Per-model defaults, picked among a few settings on Cora and CiteSeer (public splits, 5 seeds).
MODEL_DEFAULTS = {
    "sage": dict(hidden=128, dropout=0.5, lr=0.01),
    "gcn": dict(hidden=64, dropout=0.5, lr=0.01),
    "gat": dict(hidden=64, dropout=0.6, lr=0.005),
}
NODE_RULES = {"model": OneOf(MODELS, f"--task node supports --model {'|'.join(MODELS)}, got {{got}}"), **COMMON,
              "fanouts": Fanouts(), "eval_fanouts": Fanouts(optional=True), "eval_batch_size": Int(),
              "weight_decay": Real(), "hidden": Int(), "dropout": Real(0, 1, high_open=True),
              "row_norm": OneOf(("auto", "on", "off")), "prefetch": FLAG}


@dataclass
class NodeConfig:
    """Training and evaluation settings of a node-classification run (checked on creation;
    picklable so it can cross `dist.launch`). lr, hidden and dropout left out are the model's
    (`MODEL_DEFAULTS`), as `gnndist train --model M` takes them; they are set on creation (`defaults`
    records which), so `dataclasses.replace(cfg, model=...)` keeps the first model's (make a new
    config instead)."""

    model: str = "sage"
    epochs: int = 50
    patience: Optional[int] = None  # stop after this many epochs without a better validation accuracy
    batch_size: int = 32
    fanouts: list[int] = field(default_factory=lambda: [15, 10])
    eval_fanouts: Optional[list[int]] = None  # None: all neighbours at every hop
    eval_batch_size: int = 1024  # global, like batch_size
    lr: Optional[float] = None  # None (here and for hidden, dropout): the model's, MODEL_DEFAULTS
    weight_decay: float = 5e-4
    hidden: Optional[int] = None
    dropout: Optional[float] = None
    row_norm: str = "auto"  # on | off | auto: on when no feature is negative
    cache: str = "none"
    cache_size: Optional[float] = None  # a fraction (<= 1) of the remote rows, or bytes (> 1); None: CACHE_SIZE
    device: str = "cpu"
    prefetch: bool = True  # sample and fetch step i+1 in a background thread during step i
    seed: int = 0
    quiet: bool = False
    defaults: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # set on creation

    def __post_init__(self) -> None:
        check("model", self.model, NODE_RULES["model"])
        take_defaults(self, MODEL_DEFAULTS[self.model])
        check_fields(self, NODE_RULES)
        check_cache(self.cache, self.cache_size)
        if self.eval_fanouts is not None and len(self.eval_fanouts) != len(self.fanouts):
            raise GnndistError(f"--eval-fanouts needs {len(self.fanouts)} values (one per layer, like --fanouts), "
                               f"got {len(self.eval_fanouts)}")

    @classmethod
    def for_model(cls, model: str = "sage", **overrides) -> "NodeConfig":
        """The defaults of `model`, with `overrides` (None values ignored: what the CLI passes
        for flags not given)."""
        unknown = sorted(set(overrides) - {f.name for f in fields(cls)})
        if unknown:
            raise GnndistError(f"NodeConfig has no field {', '.join(unknown)}")
        return cls(model=model, **{k: v for k, v in overrides.items() if v is not None})

    def to_dict(self) -> dict:
        """The settings (without `defaults`)."""
        return {k: v for k, v in asdict(self).items() if k != "defaults"}
