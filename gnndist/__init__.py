"""gnndist: distributed training of static and temporal graph neural networks."""
from gnndist.errors import GnndistError
from gnndist.graph import Graph, TemporalGraph

__version__ = "0.1.0"
__all__ = ["Graph", "TemporalGraph", "GnndistError", "__version__"]
