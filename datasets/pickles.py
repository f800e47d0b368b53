"""Python pickles read without running code: an unpickler that builds only plain containers,
numpy arrays, numpy scalars of numbers, and a local stand-in for scipy's CSR matrix; any other
global is refused, so a crafted file cannot run code (Planetoid's files, TGB's negatives)."""
from __future__ import annotations

import collections
import math
import pickle
from typing import IO, Any

import numpy as np

from gnndist.datasets.formats import csr_to_dense
from gnndist.errors import GnndistError, first_line

try:
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy < 2
    from numpy.core.multiarray import _reconstruct


class CSRState:
    """What a pickled scipy CSR matrix holds (data, indices, indptr, shape); nothing else."""

    def __setstate__(self, state: dict) -> None:
        if not isinstance(state, dict):
            raise pickle.UnpicklingError("unexpected CSR matrix state")
        self.state = state

    def dense(self, where: str) -> np.ndarray:
        """The matrix as a dense float32 array; GnndistError naming `where` if malformed."""
        s = getattr(self, "state", {})
        try:
            parts = s["data"], s["indices"], s["indptr"], s.get("_shape", s.get("shape"))
        except KeyError as e:
            raise GnndistError(f"{where}: CSR matrix without {e}") from None
        if not all(isinstance(p, np.ndarray) for p in parts[:3]) or not isinstance(parts[3], tuple):
            raise GnndistError(f"{where}: malformed CSR matrix")
        return csr_to_dense(*parts, where=where)


_NUMPY_CORE = ("numpy.core.multiarray", "numpy._core.multiarray")
_NUMPY_NUMERIC = ("numpy.core.numeric", "numpy._core.numeric")
_SCIPY_CSR = {(m, c) for m in ("scipy.sparse.csr", "scipy.sparse._csr", "scipy.sparse")
              for c in ("csr_matrix", "csr_array")}


class _NdarrayType:
    """Stands for `numpy.ndarray` in a pickle: numpy pickles an array as `_reconstruct(ndarray,
    (0,), ...)` and then fills it from the file's bytes, so nothing else may call it. Calling
    `ndarray(shape)` directly would allocate whatever a crafted file asks for (16 TiB)."""

    def __call__(self, *args, **kwargs):
        raise pickle.UnpicklingError("refusing to call numpy.ndarray directly (numpy pickles never do)")


_NDARRAY = _NdarrayType()


def _empty_array(subtype, shape, dtype) -> np.ndarray:
    """numpy's `_reconstruct` restricted to what numpy writes: an empty array of `dtype` that
    the pickle's state then fills (so an array is never larger than the file's own bytes)."""
    if subtype is not _NDARRAY or shape != (0,):
        raise pickle.UnpicklingError("numpy array reconstructed from anything but numpy.ndarray and shape (0,)")
    return _reconstruct(np.ndarray, shape, dtype)


def _from_bytes(buf, dtype, shape, order="C") -> np.ndarray:
    """numpy's `_frombuffer` (how pickle protocol 5 writes an array) restricted to what numpy
    writes: the array of `shape` whose bytes are `buf`, no more (a dtype without objects)."""
    if not isinstance(buf, (bytes, bytearray)) or not isinstance(dtype, np.dtype) or dtype.hasobject \
            or not isinstance(shape, tuple) or not all(isinstance(n, int) and n >= 0 for n in shape) \
            or order not in ("C", "F") or math.prod(shape) * dtype.itemsize != len(buf):
        raise pickle.UnpicklingError("numpy array from a buffer that is not exactly its bytes")
    return np.frombuffer(buf, dtype).reshape(shape, order=order).copy()


def _number(dtype, data=None):
    """numpy's `scalar` (how a numpy number is pickled) for numbers only: `dtype` of a bool,
    integer or float, `data` its bytes."""
    if not isinstance(dtype, np.dtype) or dtype.kind not in "biuf" or not isinstance(data, bytes) \
            or len(data) != dtype.itemsize:
        raise pickle.UnpicklingError("numpy scalar of anything but a number's bytes")
    return np.frombuffer(data, dtype)[0]


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler of plain containers (dict, list, tuple, defaultdict), numbers, strings, numpy
    arrays and numbers, and scipy CSR matrices (as `CSRState`)."""

    def find_class(self, module: str, name: str):
        if module in _NUMPY_CORE and name == "_reconstruct":
            return _empty_array
        if module in _NUMPY_CORE and name == "scalar":
            return _number
        if module in _NUMPY_NUMERIC and name == "_frombuffer":
            return _from_bytes
        if (module, name) == ("numpy", "ndarray"):
            return _NDARRAY
        if (module, name) == ("numpy", "dtype"):
            return np.dtype
        if (module, name) in _SCIPY_CSR:
            return CSRState
        if (module, name) == ("collections", "defaultdict"):
            return collections.defaultdict
        if module in ("__builtin__", "builtins") and name == "list":
            return list
        raise pickle.UnpicklingError(f"refusing to load global '{module}.{name}'")


def restricted_load(f: IO[bytes], where: str, what: str) -> Any:
    """The object pickled in `f` (read by `RestrictedUnpickler`); GnndistError("WHERE: not a valid
    WHAT: ...") if it is not one, or asks for a global outside the admitted ones."""
    try:
        return RestrictedUnpickler(f, encoding="latin1").load()
    except MemoryError:  # a length field larger than memory
        raise GnndistError(f"{where}: not a valid {what}: it asks for more memory than there is") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            OverflowError) as e:
        raise GnndistError(f"{where}: not a valid {what}: {first_line(e)}") from None
