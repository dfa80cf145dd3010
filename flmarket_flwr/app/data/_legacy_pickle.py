"""Restricted reader of the Python 2 pickles that CIFAR-10 and DEAP ship.

Only the globals such files need may be loaded, so a foreign or malicious file raises ``ValueError`` instead
of running code (:func:`load_pickled_dict`).
"""

from __future__ import annotations

import codecs
import pickle
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["load_pickled_dict"]


def _numpy_multiarray() -> Any:
    """Return numpy's ``multiarray`` module (``numpy._core`` from numpy 2 on)."""
    try:
        from numpy._core import multiarray

        multiarray._reconstruct  # noqa: B018  (numpy 1.26 has only a stub numpy._core)
    except (ImportError, AttributeError):  # numpy < 2
        from numpy.core import multiarray  # type: ignore[no-redef]
    return multiarray


@lru_cache(maxsize=1)
def _allowed_globals() -> dict[tuple[str, str], Any]:
    """The globals a pickled dict of numpy arrays, lists and strings needs."""
    multiarray = _numpy_multiarray()
    allowed: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): codecs.encode,
    }
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = multiarray._reconstruct
        allowed[(module, "scalar")] = multiarray.scalar
    return allowed


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that resolves only the globals of :func:`_allowed_globals`."""

    def find_class(self, module: str, name: str) -> Any:
        """Return an allowed global, or raise ``pickle.UnpicklingError``."""
        try:
            return _allowed_globals()[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed in a data file") from None


def load_pickled_dict(path: Path) -> dict[str, Any]:
    """Read a pickled ``dict`` (Python 2 or 3) with ``str`` keys.

    Parameters
    ----------
    path : pathlib.Path
        The pickle file.

    Returns
    -------
    dict
        The unpickled dictionary, ``bytes`` keys decoded as latin-1.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the file is not a readable pickle of a ``dict``, or needs globals other
        than numpy's array reconstructors.

    Notes
    -----
    The files are read with ``encoding="latin1"`` (numpy's setting for Python 2 pickles: a Python 2 ``str``
    becomes a ``str`` whose code points are the raw bytes, which numpy turns back into the array's buffer) and
    with a restricted unpickler: only numpy's array and dtype reconstructors and ``_codecs.encode`` (which
    Python 3 uses for ``bytes`` at protocol 2) may be loaded. Keys come back as ``str`` whether the file
    wrote ``str`` or ``bytes`` keys.
    """
    with open(path, "rb") as handle:
        try:
            content = _RestrictedUnpickler(handle, encoding="latin1").load()
        except FileNotFoundError:
            raise
        except Exception as error:  # corrupt, truncated or foreign content
            raise ValueError(f"{path}: not a readable pickle file ({type(error).__name__}: {error})") from error
    if not isinstance(content, dict):
        raise ValueError(f"{path}: expected a pickled dict, found {type(content).__name__}")
    return {key.decode("latin1") if isinstance(key, bytes) else key: value for key, value in content.items()}
