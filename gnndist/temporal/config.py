"""`LinkConfig`: the settings of a link-prediction run (the CLI builds one from its flags)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from gnndist.errors import GnndistError
from gnndist.validate import (COMMON, MEMORY_MODES, Int, OneOf, Real, check, check_cache, check_fields, flag,
                              take_defaults)

MODELS = ("tgn", "jodie", "apan", "dyrep", "tgat")
# Per-model defaults. TGN and JODIE meet their published UCI figures with these; DyRep takes
# DyGLib's settings for it (memory 172 as DyGLib's padded features, Adam at 1e-4, patience 20,
# 10 recent neighbours; DyGLib's dropout for DyRep on UCI is 0, as here).
MODEL_DEFAULTS = {
    "tgn": dict(memory_dim=100, lr=1e-3, patience=5, num_neighbors=10),
    "jodie": dict(memory_dim=100, lr=1e-3, patience=5, num_neighbors=10),
    "apan": dict(memory_dim=100, lr=1e-3, patience=5, num_neighbors=10),
    "dyrep": dict(memory_dim=172, lr=1e-4, patience=20, num_neighbors=10),
    "tgat": dict(memory_dim=100, lr=1e-3, patience=5, num_neighbors=10),
}
NEG_STRATEGIES = ("random", "historical", "inductive")
SHARES = ("even", "owner")
SAMPLINGS = ("recent", "uniform")
LR_SCHEDULES = ("constant", "cosine")
RULES = {"model": OneOf(MODELS), **COMMON, "lr_schedule": OneOf(LR_SCHEDULES),
         "clip_grad": Real(low_open=True, optional=True), "memory_dim": Int(), "time_dim": Int(),
         "num_neighbors": Int(), "sampling": OneOf(SAMPLINGS), "mailbox": Int(), "neg": OneOf(NEG_STRATEGIES),
         "eval_negatives": Int(), "memory": OneOf(MEMORY_MODES), "share": OneOf(SHARES)}


@dataclass(frozen=True)
class LinkConfig:
    """Training and evaluation settings of a temporal link-prediction run (checked on creation).
    memory_dim, lr, patience and num_neighbors left out are the model's (`MODEL_DEFAULTS`), as
    `gnndist train --model M` takes them; they are set on creation (`defaults` records which), so
    `dataclasses.replace(cfg, model=...)` keeps the first model's (make a new config instead)."""

    model: str = "tgn"
    epochs: int = 50
    patience: Optional[int] = None  # stop after this many epochs without a better validation AP (to never stop
    #                                 early, give one >= epochs)
    batch_size: int = 200  # global: events per step over all ranks
    lr: Optional[float] = None  # None (here and for patience, memory_dim, num_neighbors): MODEL_DEFAULTS
    lr_schedule: str = "constant"  # constant | cosine (decay over `epochs`)
    clip_grad: Optional[float] = None  # global norm of the summed gradient
    memory_dim: Optional[int] = None
    time_dim: int = 100
    num_neighbors: Optional[int] = None
    sampling: str = "recent"  # temporal neighbours: the most recent, or uniform draws (JODIE samples none)
    mailbox: int = 10  # APAN's mails kept per node
    neg: str = "random"  # negatives of validation and test: random | historical | inductive
    eval_negatives: int = 10  # per positive, for MRR (AP and AUC use the first)
    memory: str = "replicated"  # node state across ranks: replicated | partitioned
    share: str = "even"  # which rank scores an event: even (a batch's events evened out over the ranks) | owner
    #                      (the owner of its source: no event travels)
    cache: str = "none"  # remote edge-feature cache: none | degree | presample | adaptive
    cache_size: Optional[float] = None  # a fraction (<= 1) of the remote events, or bytes (> 1); None: CACHE_SIZE
    device: str = "cpu"
    seed: int = 0
    quiet: bool = False
    defaults: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # set on creation

    def __post_init__(self) -> None:
        check("model", self.model, RULES["model"])
        take_defaults(self, MODEL_DEFAULTS[self.model])
        check_fields(self, RULES)
        check_cache(self.cache, self.cache_size)
        if self.model == "jodie" and self.sampling != "recent":
            raise GnndistError(f"{flag('sampling')} {self.sampling}: jodie samples no neighbours")

    def to_dict(self) -> dict:
        """The settings (without `defaults`)."""
        return {k: v for k, v in asdict(self).items() if k != "defaults"}


NODE_TASKS = ("node", "node-property")  # the node tasks on a temporal graph (gnndist.temporal.nodes)
DECODER_RULES = {"hidden": Int(), "dropout": Real(0, 1, high_open=True), "lr": Real(low_open=True),
                 "weight_decay": Real(), "epochs": Int(), "patience": Int(optional=True), "batch_size": Int()}


@dataclass(frozen=True)
class DecoderConfig:
    """The decoder of a node task on a temporal graph: an MLP (one hidden layer) on the trained
    link model's frozen node embeddings, with TGL's train_node.py's batch size, epochs, hidden
    size and learning rate, kept at its best validation metric."""

    hidden: int = 100
    dropout: float = 0.1
    lr: float = 1e-3
    weight_decay: float = 0.0
    epochs: int = 100
    patience: Optional[int] = 10  # stop after this many epochs without a better validation metric (None: never)
    batch_size: int = 4000  # global: labelled rows per step over all ranks

    def __post_init__(self) -> None:
        check_fields(self, DECODER_RULES)

    def to_dict(self) -> dict:
        return asdict(self)
