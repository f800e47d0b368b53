"""gnndist: distributed training of static and temporal graph neural networks.

The trainers' entry points load on first use (`gnndist.train_link` imports torch), so that
`import gnndist` stays light.
"""
from gnndist.runtime import threads

threads.configure()  # before anything loads an OpenMP runtime (see gnndist.runtime.threads)

from importlib import import_module  # noqa: E402
from typing import Any  # noqa: E402

from gnndist.errors import GnndistError  # noqa: E402
from gnndist.graph import Graph, TemporalGraph  # noqa: E402
from gnndist import moved  # noqa: E402

moved.install()

__version__ = "0.1.0"
_LAZY = {"train_link": "gnndist.temporal.fit", "LinkConfig": "gnndist.temporal.config",
         "train_temporal_node": "gnndist.temporal.nodes", "DecoderConfig": "gnndist.temporal.config",
         "train_node": "gnndist.static.trainer", "NodeConfig": "gnndist.static.config",
         "Outputs": "gnndist.outputs", "DataSource": "gnndist.datasets"}
__all__ = ["Graph", "TemporalGraph", "GnndistError", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gnndist' has no attribute {name!r}")
