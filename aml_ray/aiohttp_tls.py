"""aiohttp imported with its default TLS contexts' CA certificates loaded in a thread (issue 29, the fixed cost).

aiohttp builds two default SSL contexts when it is imported, and each loads the system's CA certificates
(``SSLContext.set_default_verify_paths``): 38 ms (3 runs) of the 0.37 s before ``aml-ray run``'s first
request, though a participant on plain HTTP never uses them. Imported through this module, aiohttp makes
those contexts without the load, which a thread of its own then makes (OpenSSL reads the certificates
without holding the GIL, beside the importer's next work: the command's dataset check). Every HTTPS
connection aiohttp makes waits for that load first (``TCPConnector._get_ssl_context``, which picks a
connection's context, is wrapped), so no certificate is ever checked against an empty store. Where aiohttp
is imported already, or lacks that method, nothing is deferred.

Every module of aml-ray that imports aiohttp imports this module first, so whichever comes first in a
process does the import.
"""

from __future__ import annotations

import ssl
import sys
import threading

#: Set once the deferred CA certificates are loaded (at once when nothing was deferred).
loaded = threading.Event()
_errors: list[BaseException] = []


def _import_aiohttp() -> None:
    """Import aiohttp, its default contexts' CA load deferred to a thread when the load can be guarded."""
    if "aiohttp" in sys.modules:
        loaded.set()
        return
    importer = threading.get_ident()
    deferred: list[ssl.SSLContext] = []
    real = ssl.SSLContext.set_default_verify_paths
    own = "set_default_verify_paths" in vars(ssl.SSLContext)

    def record(context: ssl.SSLContext) -> None:
        if threading.get_ident() == importer:
            deferred.append(context)
        else:  # another thread's context, made meanwhile: loaded as usual
            real(context)

    ssl.SSLContext.set_default_verify_paths = record
    try:
        import aiohttp.connector as connector
    finally:
        if own:
            ssl.SSLContext.set_default_verify_paths = real
        else:
            del ssl.SSLContext.set_default_verify_paths
    pick = getattr(connector.TCPConnector, "_get_ssl_context", None)
    if pick is None or not deferred:  # nothing to guard with, or nothing deferred: load here, as aiohttp would
        for context in deferred:
            real(context)
        loaded.set()
        return

    def load() -> None:
        try:
            for context in deferred:
                real(context)
        except BaseException as exc:  # noqa: BLE001 - raised where an HTTPS connection needs the contexts
            _errors.append(exc)
        finally:
            loaded.set()

    def get_ssl_context(self, req):
        context = pick(self, req)
        if context is not None:
            wait()
        return context

    connector.TCPConnector._get_ssl_context = get_ssl_context
    threading.Thread(target=load, name="aml-ray-tls-certificates", daemon=True).start()


def wait() -> None:
    """Wait until aiohttp's default contexts have their CA certificates.

    Raises:
        The error the load raised (an HTTPS connection then fails with it, never unverified).
    """
    loaded.wait()
    if _errors:
        raise _errors[0]


_import_aiohttp()
