"""gnndist: distributed training of static and temporal graph neural networks."""
from gnndist import threads

threads.configure()  # before anything loads an OpenMP runtime (see gnndist.threads)

from gnndist.errors import GnndistError  # noqa: E402
from gnndist.graph import Graph, TemporalGraph  # noqa: E402

__version__ = "0.1.0"
__all__ = ["Graph", "TemporalGraph", "GnndistError", "__version__"]
