"""Datasets: file-format loaders, built-in generators, and split helpers.

`load(name_or_path, format=None, **generator_options)` returns a `Graph` or a
`TemporalGraph`. A name picks a built-in generator (`gnndist datasets` lists them); a path
is read by the loader its extension and content point to, or the one `format` names.
"""
from gnndist.datasets.registry import FORMATS, GENERATORS, DataSource, load
from gnndist.datasets.split import chronological_split, new_nodes_after

__all__ = ["DataSource", "FORMATS", "GENERATORS", "load",
           "chronological_split", "new_nodes_after"]
