"""Keep pyarrow from importing pandas in processes that never use it (issue 29, the CPU footprint).

pyarrow imports pandas, when it is installed (Ray Data needs it), at the first table or array it builds
from Python objects (``pa.table({...})``, ``Table.from_pylist``): before converting a sequence it asks its
pandas shim whether the object is a pandas one, and the shim's first answer imports pandas. That is
0.24 s of CPU in every aml-ray process that builds a table (the driver's inputs, the Ingest actor, the
client actors' Search tables), for a library none of them calls: aml-ray builds its tables from Python
objects and reads and writes Arrow and Parquet only (measured in a process with pyarrow and polars
imported, on this 2-core machine; docs/benchmarks.md).

:func:`keep_pandas_out_of_pyarrow` lets the shim ask its question once while ``import pandas`` fails (a
finder first on ``sys.meta_path`` raises ``ModuleNotFoundError`` for it; ``sys.modules["pandas"] = None``
does not work here: pyarrow's compiled import takes the None for the module), then removes the finder.
The shim remembers "no pandas" for its checks (``pyarrow/pandas-shim.pxi``: ``_have_pandas_internal``).
A call that needs pandas (``Table.to_pandas()``) still imports it then: the shim tries again for those.
A pandas object given to pyarrow afterwards is converted as a plain sequence.
"""

from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder

#: Whether this process's pyarrow has been kept from importing pandas (:func:`keep_pandas_out_of_pyarrow`).
_done = False


class _NoPandas(MetaPathFinder):
    """A finder that refuses pandas (while :func:`keep_pandas_out_of_pyarrow` asks pyarrow's shim)."""

    def find_spec(self, name: str, path, target=None):  # noqa: ANN001 - importlib's signature
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r} (kept out of pyarrow)", name=name)
        return None


def keep_pandas_out_of_pyarrow() -> bool:
    """Make pyarrow's first check for pandas find none, so that it never imports pandas on its own.

    Call it early in a process that builds Arrow tables from Python objects and never hands pyarrow a pandas
    object (the ``aml-ray run`` command, the client and stage actors), where no other thread may import
    pandas: for a moment ``import pandas`` fails in every thread (``aml-ray run`` calls it with only its
    pre-flight's thread running, an HTTP client). Idempotent.

    Returns:
        True when this call made the check; False when pandas was already imported (nothing to save), or
        the check was made before.
    """
    global _done
    if _done or "pandas" in sys.modules:
        return False
    import pyarrow as pa

    _done = True
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array(["x"])  # the shim's first check (array.pxi `_is_array_like`) and the C++ converter's, without pandas
    finally:
        sys.meta_path.remove(finder)
    return True
