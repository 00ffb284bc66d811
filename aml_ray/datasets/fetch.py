"""Download a dataset file into a local cache and verify its sha256.

Generic helper for every dataset adapter. A benchmark release is pinned by the sha256 of its bytes
(see ``shared/datasets/MANIFEST.md``); a file with another hash is refused unless the operator
explicitly allows it (``--allow-hash-mismatch``), so a silently changed upstream file never changes a
score. Downloads are written to a temporary file beside the destination and moved into place with
``os.replace`` only after the hash checks out, so the cache never holds a partial or unverified file.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

#: Default download timeout in seconds (connect, read, write and pool each).
DEFAULT_TIMEOUT_S = 60.0
_BLOCK = 1 << 20


class DatasetError(Exception):
    """Base class of dataset file errors."""


class DatasetHashMismatch(DatasetError, ValueError):
    """A dataset file's sha256 is not the pinned one.

    Args:
        path: the file (or the URL it was downloaded from).
        expected: the pinned sha256 (hex).
        actual: the sha256 of the bytes seen (hex).
    """

    def __init__(self, path: str | os.PathLike[str], expected: str, actual: str):
        self.path = str(path)
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"sha256 mismatch for {self.path}: expected {expected}, got {actual}. The file is not the "
            "pinned release; use the pinned file, or pass --allow-hash-mismatch to run on it anyway "
            "(results are then not comparable with the release baseline)."
        )

    def __reduce__(self):
        return (DatasetHashMismatch, (self.path, self.expected, self.actual))


class DatasetDownloadError(DatasetError):
    """A dataset file could not be downloaded (offline, HTTP error, timeout).

    Args:
        url: the source URL.
        reason: what went wrong.
    """

    def __init__(self, url: str, reason: str):
        self.url = url
        self.reason = reason
        super().__init__(
            f"could not download {url}: {reason}. If this machine is offline or cannot reach the "
            "source, download the file elsewhere and pass --data PATH."
        )

    def __reduce__(self):
        return (DatasetDownloadError, (self.url, self.reason))


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The sha256 of a file's bytes.

    Args:
        path: the file to hash.

    Returns:
        The lowercase hex digest.

    Raises:
        OSError: if the file cannot be read.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def verify_sha256(path: str | os.PathLike[str], expected: str) -> None:
    """Check that a file has the pinned sha256.

    Args:
        path: the file to check.
        expected: the pinned sha256 (hex, any case).

    Raises:
        DatasetHashMismatch: if the file's sha256 differs; the message names both hashes and the
            ``--allow-hash-mismatch`` override.
        OSError: if the file cannot be read.
    """
    actual = sha256_file(path)
    if actual != expected.lower():
        raise DatasetHashMismatch(path, expected.lower(), actual)


def fetch_to_cache(
    url: str,
    dest: str | os.PathLike[str],
    expected_sha256: str,
    timeout: float = DEFAULT_TIMEOUT_S,
    *,
    allow_hash_mismatch: bool = False,
) -> Path:
    """Download ``url`` to ``dest`` atomically, verifying its sha256 first.

    The body is streamed into a temporary file in ``dest``'s directory while it is hashed; only a
    verified file is moved onto ``dest`` (``os.replace``). On any failure the temporary file is removed
    and ``dest`` is left as it was.

    Args:
        url: the source URL (redirects are followed).
        dest: the cache path to write; parent directories are created.
        expected_sha256: the pinned sha256 (hex).
        timeout: httpx timeout in seconds.
        allow_hash_mismatch: keep a file with another hash (logs a warning) instead of refusing it.

    Returns:
        ``dest`` as a Path.

    Raises:
        DatasetDownloadError: on a transport error, timeout or non-2xx status; the message says to pass
            ``--data PATH``.
        DatasetHashMismatch: if the downloaded bytes have another sha256 (nothing is written).
    """
    import httpx  # here: a run with its file at hand (nearly all) does not import it

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            try:
                with httpx.stream("GET", url, timeout=timeout, follow_redirects=True) as resp:
                    if not resp.is_success:
                        raise DatasetDownloadError(url, f"HTTP {resp.status_code}")
                    for block in resp.iter_bytes(_BLOCK):
                        h.update(block)
                        out.write(block)
            except httpx.HTTPError as exc:
                raise DatasetDownloadError(url, f"{type(exc).__name__}: {exc}") from exc
        actual = h.hexdigest()
        if actual != expected_sha256.lower():
            if not allow_hash_mismatch:
                raise DatasetHashMismatch(url, expected_sha256.lower(), actual)
            log.warning("keeping %s with sha256 %s (expected %s) because hash mismatches are allowed",
                        url, actual, expected_sha256)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return dest
