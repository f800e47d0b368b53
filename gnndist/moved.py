"""Import paths of modules that moved, kept working for one release: importing one by its old
name warns (DeprecationWarning) and gives the module at its new place."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Optional, Sequence

MOVED = {
    "gnndist.dist": "gnndist.runtime.dist",
    "gnndist.launch": "gnndist.runtime.launch",
    "gnndist.threads": "gnndist.runtime.threads",
    "gnndist.device": "gnndist.runtime.device",
    "gnndist.train": "gnndist.cli.train",
    "gnndist.demo": "gnndist.cli.demo",
    "gnndist.info_cli": "gnndist.cli.info_cli",
    "gnndist.predict_cli": "gnndist.cli.predict_cli",
    "gnndist.plot_cli": "gnndist.cli.plot_cli",
    "gnndist.partition.cli": "gnndist.cli.partition_cli",
    "gnndist.datasets.cli": "gnndist.cli.datasets_cli",
}


class OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds a moved module by its old name (`MOVED`)."""

    def find_spec(self, name: str, path: Optional[Sequence[str]] = None, target: Optional[ModuleType] = None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; the old name goes in the next release", DeprecationWarning,
                      stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module at its new place has run already."""


def install() -> None:
    """Let the old names import (once per process)."""
    if not any(isinstance(f, OldPaths) for f in sys.meta_path):
        sys.meta_path.append(OldPaths())
