"""Rules for the values of configuration fields and flags, checked before any work.

A rule says what a value may be; `check_fields` applies a table of rules to a config's fields
and raises one `GnndistError` naming the flag (`--batch-size` for the field `batch_size`), so a
config built in Python fails with the same line as the CLI. `problem` gives the rule's text
without the flag, for a check that words its own line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real as RealNumber
from typing import Any, Optional, Sequence, Union

from gnndist.errors import GnndistError

INT_MAX = 2**63 - 1  # what numpy's SeedSequence, torch's seeds and int64 counts all take


def flag(name: str) -> str:
    """The CLI flag of a config field: `batch_size` -> `--batch-size`."""
    return "--" + name.replace("_", "-")


def _show(v: int) -> str:
    return "2**63-1" if v == INT_MAX else str(v)


def is_int(v: Any) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(v, Integral) and not isinstance(v, bool)


@dataclass(frozen=True)
class Int:
    """An integer from `low` to `high` (None allowed when `optional`)."""

    low: int = 1
    high: int = INT_MAX
    optional: bool = False

    def problem(self, v: Any) -> Optional[str]:
        """What is wrong with `v` (None: nothing)."""
        if (v is None and self.optional) or (is_int(v) and self.low <= v <= self.high):
            return None
        return f"must be an integer from {_show(self.low)} to {_show(self.high)}, got {v!r}"


@dataclass(frozen=True)
class Real:
    """A finite number above `low` (or at it, when `low_open` is False) and below `high` (or
    at it, when `high_open` is False); None allowed when `optional`."""

    low: float = 0.0
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    optional: bool = False

    def problem(self, v: Any) -> Optional[str]:
        """What is wrong with `v` (None: nothing)."""
        if v is None and self.optional:
            return None
        if isinstance(v, RealNumber) and not isinstance(v, bool) and math.isfinite(v) and \
                (self.low < v if self.low_open else self.low <= v) and \
                (v < self.high if self.high_open else v <= self.high):
            return None
        bounds = [f"{'>' if self.low_open else '>='} {self.low:g}"]
        if math.isfinite(self.high):
            bounds.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        return f"must be a finite number {' and '.join(bounds)}, got {v!r}"


@dataclass(frozen=True)
class OneOf:
    """One of `values`; `text`, if given, is the whole message (with {got} for the value)."""

    values: tuple
    text: str = ""

    def problem(self, v: Any) -> Optional[str]:
        """What is wrong with `v` (None: nothing)."""
        if any(v is x or (type(v) is type(x) and v == x) for x in self.values):
            return None
        return (self.text or f"must be one of {', '.join(map(str, self.values))}, got {{got}}").format(got=repr(v))


@dataclass(frozen=True)
class Fanouts:
    """A non-empty list of per-hop neighbour counts, each from 1 to 2**63-1 or -1 (all); None
    allowed when `optional`."""

    optional: bool = False

    def problem(self, v: Any) -> Optional[str]:
        """What is wrong with `v` (None: nothing)."""
        if v is None and self.optional:
            return None
        if isinstance(v, (list, tuple)) and v and all(is_int(f) and (f == -1 or 1 <= f <= INT_MAX) for f in v):
            return None
        return f"must be one or more integers, each from 1 to 2**63-1 or -1 (all), got {v!r}"


Rule = Union[Int, Real, OneOf, Fanouts]
SEED = Int(0)
FLAG = OneOf((False, True))
CACHE_POLICIES = ("none", "degree", "presample", "adaptive")
CACHE_SIZE = 0.1  # a cache's capacity where no size is given: a tenth of the remote rows
DEVICES = ("cpu", "cuda")
MEMORY_MODES = ("replicated", "partitioned")  # where a link model's node state lives across ranks
TASK_OF_KIND = {"static": "node", "temporal": "link"}  # --task of each kind of graph
# the fields both trainers' configs have
COMMON = {"epochs": Int(), "patience": Int(optional=True), "batch_size": Int(), "lr": Real(low_open=True),
          "cache": OneOf(CACHE_POLICIES),
          "cache_size": Real(optional=True), "device": OneOf(DEVICES), "seed": SEED, "quiet": FLAG}


def check(name: str, value: Any, rule: Rule) -> None:
    """GnndistError naming `name`'s flag unless `value` follows `rule`."""
    problem = rule.problem(value)
    if problem is not None:
        raise GnndistError(problem if isinstance(rule, OneOf) and rule.text else f"{flag(name)} {problem}")


def check_integer(name: str, value: Any, optional: bool = False) -> None:
    """GnndistError naming `name`'s flag unless `value` is an integer (None allowed when
    `optional`); its range is checked where it is known."""
    if not (value is None and optional) and not is_int(value):
        raise GnndistError(f"{flag(name)} must be an integer, got {value!r}")


def check_type(what: str, value: Any, cls: type) -> None:
    """GnndistError unless `value` is a `cls` (a library call's argument `what`)."""
    if not isinstance(value, cls):
        raise GnndistError(f"{what} must be of type {cls.__name__}, got {type(value).__name__}")


def check_cache(cache: str, cache_size: Optional[float]) -> None:
    """A size is a cache's: given without one, a GnndistError."""
    if cache_size is not None and cache == "none":
        raise GnndistError(f"{flag('cache_size')} needs a cache: give {flag('cache')} degree, presample or adaptive")


def cache_capacity(cache_size: Optional[float]) -> float:
    """A cache's capacity: `cache_size`, or CACHE_SIZE where none is given."""
    return CACHE_SIZE if cache_size is None else cache_size


def check_fields(obj: Any, rules: dict[str, Rule]) -> None:
    """`check` every field of `obj` that `rules` names, in the table's order."""
    for name, rule in rules.items():
        check(name, getattr(obj, name), rule)


def take_defaults(cfg: Any, defaults: dict[str, Any]) -> None:
    """Set the fields of `cfg` that are None to their values in `defaults` (its model's), and
    record in `cfg.defaults` the fields that hold their model's value without the user giving
    them: those set here, and those a `dataclasses.replace` of such a config carried over."""
    kept = {k: v for k, v in cfg.defaults.items() if getattr(cfg, k) == v}
    taken = {k: v for k, v in defaults.items() if getattr(cfg, k) is None}
    for name, value in taken.items():
        object.__setattr__(cfg, name, value)  # the link config is frozen
    object.__setattr__(cfg, "defaults", {**kept, **taken})


def check_seeds(name: str, seeds: Sequence[int]) -> None:
    """A list of distinct seeds (each as `SEED`), named by `name`'s flag."""
    for s in seeds:
        check(name, s, SEED)
    if not seeds or len(set(seeds)) != len(seeds):
        raise GnndistError(f"{flag(name)} must be distinct seeds, got {list(seeds)!r}")
