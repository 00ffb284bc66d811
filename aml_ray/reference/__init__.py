"""Reference memory systems that speak the AML Add/Search contract.

- :class:`ReferenceServer`: the BM25 reference system as a subprocess on a loopback port.
- :func:`aml_ray.reference.app.create_app`: its FastAPI app (SQLite store + per-user BM25).
- ``python -m aml_ray.reference --db PATH``: run it by hand; prints ``READY http://host:port``.
"""

from aml_ray.reference.server import ReferenceServer

__all__ = ["ReferenceServer"]
