"""Multimodal content parts: validation, the run's media store, and image token estimates.

In the Multimodal track a message's ``content``, a Search ``query`` and a returned memory's ``content``
may be an ordered, non-empty array of parts (AML API guide, "Add / Search contract": "Multimodal may use
strings or ordered text/image_url content parts")::

    {"type": "text", "text": "..."}
    {"type": "image_url", "image_url": {"url": "data:image/<png|jpeg|webp|gif>;base64,..."}}

Rules checked by :func:`check_parts` (a violation is a :class:`aml_ray.contract.ContractError` naming the
part, e.g. ``data[2].content[1].image_url.url``):

- the array is non-empty and has at most :attr:`MediaLimits.max_parts` parts;
- ``type`` is ``text`` or ``image_url``; a text part's ``text`` is a non-blank string;
- an image is a ``data:`` URL of an allowed type, base64 that decodes strictly, whose bytes start with
  that type's signature; its decoded size is within ``max_image_bytes``;
- the decoded images of one request (or one Search response) total at most ``max_request_bytes``.

The allowed types and the default size limits follow OpenAI's vision input rules (PNG, JPEG, WEBP and
non-animated GIF; "up to 50 MB total payload size per request"), the answer model's edge; a suite sets
its own :class:`MediaLimits` (``"media"`` in the suite file).

Evidence never holds image bytes inline: :class:`MediaStore` keeps each image once, as
``<run_dir>/media/<sha256>.<ext>``, and rows refer to it as ``media:<sha256>``.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import os
import re
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from aml_ray.contract_errors import ContractError

#: Image types the contract accepts, by the subtype of ``data:image/<subtype>``; value = file extension.
IMAGE_TYPES: dict[str, str] = {"png": "png", "jpeg": "jpg", "webp": "webp", "gif": "gif"}
#: How each type's bytes start (PNG/JPEG/GIF/WEBP file signatures).
_SIGNATURES: dict[str, Callable[[bytes], bool]] = {
    "png": lambda b: b.startswith(b"\x89PNG\r\n\x1a\n"),
    "jpeg": lambda b: b.startswith(b"\xff\xd8\xff"),
    "gif": lambda b: b.startswith((b"GIF87a", b"GIF89a")),
    "webp": lambda b: len(b) >= 12 and b[:4] == b"RIFF" and b[8:12] == b"WEBP",
}
_DATA_URL = re.compile(r"^data:image/([A-Za-z0-9.+-]+);base64,(.*)$", re.DOTALL)
#: How an image appears inside rendered text (memory ``content`` in evidence, prompts before splitting).
IMAGE_MARKER = re.compile(r"<image media:([0-9a-f]{64})>")
MEDIA_PREFIX = "media:"
MiB = 1024 * 1024


class MediaLimits(BaseModel):
    """Media limits of a multimodal suite (set in the suite file under ``"media"``).

    Attributes:
        image_types: allowed ``data:image/<type>`` subtypes (default png, jpeg, webp, gif).
        max_image_bytes: largest decoded image, in bytes (default 20 MiB).
        max_request_bytes: most decoded image bytes in one Add, one Search query or one Search response
            (default 50 MiB: OpenAI's "50 MB total payload size per request").
        max_parts: most parts in one content array (default 256).
        image_tokens: the answer context's cost of one image: ``"openai_tiles"`` (OpenAI's high-detail
            rule, :func:`openai_image_tokens`) or a fixed number of tokens per image.

    Examples:
        >>> MediaLimits().max_image_bytes
        20971520
        >>> MediaLimits(image_types=("png", "bmp"))
        Traceback (most recent call last):
        ...
        pydantic_core._pydantic_core.ValidationError: 1 validation error for MediaLimits
        ...
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    image_types: tuple[str, ...] = ("png", "jpeg", "webp", "gif")
    max_image_bytes: int = Field(default=20 * MiB, ge=1)
    max_request_bytes: int = Field(default=50 * MiB, ge=1)
    max_parts: int = Field(default=256, ge=1)
    image_tokens: int | str = "openai_tiles"

    def model_post_init(self, _ctx: Any) -> None:
        bad = [t for t in self.image_types if t not in IMAGE_TYPES]
        if bad:
            raise ValueError(f"image_types {bad} are not supported; allowed: {sorted(IMAGE_TYPES)}")
        if isinstance(self.image_tokens, str) and self.image_tokens != "openai_tiles":
            raise ValueError(f"image_tokens must be 'openai_tiles' or a positive integer, got {self.image_tokens!r}")
        if isinstance(self.image_tokens, int) and self.image_tokens < 1:
            raise ValueError("image_tokens must be >= 1")


def media_context(limits: MediaLimits | None) -> dict[str, Any] | None:
    """The pydantic validation context that lets contract models accept content parts.

    Args:
        limits: the suite's media limits; None (Textual, Coding) keeps content strings-only.

    Returns:
        ``{"media": limits}`` or None.
    """
    return {"media": limits} if limits is not None else None


def limits_from_context(context: Any) -> MediaLimits | None:
    """The :class:`MediaLimits` in a validation context, or None when parts are not allowed."""
    if isinstance(context, dict):
        value = context.get("media")
        if isinstance(value, MediaLimits):
            return value
    return None


def decode_data_url(url: Any, field: str, limits: MediaLimits, request_id: str | None = None
                    ) -> tuple[str, bytes]:
    """Decode an image ``data:`` URL strictly.

    Args:
        url: the ``image_url.url`` value.
        field: the field path for errors.
        limits: allowed types and the per-image size limit.
        request_id: for error messages.

    Returns:
        ``(type, bytes)``, e.g. ``("png", b"\\x89PNG...")``.

    Raises:
        ContractError: not a string, not a base64 ``data:image/...`` URL, a type that is not allowed,
            invalid base64, bytes that are not that type, or an image over ``max_image_bytes``.
    """
    if not isinstance(url, str):
        raise ContractError(field, f"must be a string data URL, got {type(url).__name__}", request_id)
    m = _DATA_URL.match(url)
    if not m:
        raise ContractError(field, "must be a base64 data URL 'data:image/<type>;base64,...' (remote URLs are "
                            f"not accepted), got {url[:40]!r}", request_id)
    kind = m.group(1).lower()
    if kind not in limits.image_types:
        raise ContractError(field, f"image type {kind!r} is not allowed; allowed: {list(limits.image_types)}",
                            request_id)
    payload = m.group(2)
    if len(payload) * 3 // 4 > limits.max_image_bytes + 3:
        raise ContractError(field, f"image is about {len(payload) * 3 // 4} bytes, over the per-image limit of "
                            f"{limits.max_image_bytes} bytes", request_id)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ContractError(field, "the base64 payload is not valid base64", request_id) from None
    if not data:
        raise ContractError(field, "the image is empty", request_id)
    if len(data) > limits.max_image_bytes:
        raise ContractError(field, f"image is {len(data)} bytes, over the per-image limit of "
                            f"{limits.max_image_bytes} bytes", request_id)
    if not _SIGNATURES[kind](data):
        raise ContractError(field, f"the bytes are not a {kind} image (wrong file signature)", request_id)
    return kind, data


def check_parts(value: Any, field: str, limits: MediaLimits, *, request_id: str | None = None,
                strict_keys: bool = True) -> int:
    """Validate one content-parts array (see the module rules).

    Args:
        value: the ``content`` / ``query`` value, expected to be a list of parts.
        field: its field path, e.g. ``"messages[0].content"``; errors name ``<field>[<i>]...``.
        limits: the suite's media limits.
        request_id: for error messages.
        strict_keys: refuse undeclared keys in a part (requests); False ignores them (responses: "the
            platform reads only the declared fields").

    Returns:
        The decoded image bytes of the array (for the per-request total).

    Raises:
        ContractError: naming the offending part.
    """
    if not isinstance(value, list) or not value:
        raise ContractError(field, "must be a non-empty string or a non-empty array of content parts", request_id)
    if len(value) > limits.max_parts:
        raise ContractError(field, f"has {len(value)} parts, over the limit of {limits.max_parts}", request_id)
    total = 0
    for j, part in enumerate(value):
        where = f"{field}[{j}]"
        if not isinstance(part, dict):
            raise ContractError(where, f"each part must be an object, got {type(part).__name__}", request_id)
        kind = part.get("type")
        if kind == "text":
            allowed = {"type", "text"}
            text = part.get("text")
            if not isinstance(text, str) or not text.strip():
                raise ContractError(f"{where}.text", f"must be a non-empty string, got {text!r}"[:160], request_id)
        elif kind == "image_url":
            allowed = {"type", "image_url"}
            inner = part.get("image_url")
            if not isinstance(inner, dict):
                raise ContractError(f"{where}.image_url", "must be an object {\"url\": \"data:image/...\"}", request_id)
            extra_inner = set(inner) - {"url"}
            if strict_keys and extra_inner:
                raise ContractError(f"{where}.image_url", f"undeclared keys {sorted(extra_inner)}", request_id)
            _, data = decode_data_url(inner.get("url"), f"{where}.image_url.url", limits, request_id)
            total += len(data)
        else:
            raise ContractError(f"{where}.type", f"unknown part type {kind!r}; allowed: 'text', 'image_url'",
                                request_id)
        extra = set(part) - allowed
        if strict_keys and extra:
            raise ContractError(where, f"undeclared keys {sorted(extra)}", request_id)
    return total


def check_request_total(total: int, field: str, limits: MediaLimits, request_id: str | None = None) -> None:
    """Refuse a request (or response) whose images together pass ``max_request_bytes``.

    Raises:
        ContractError: naming ``field`` (where the total was passed).
    """
    if total > limits.max_request_bytes:
        raise ContractError(field, f"images total {total} bytes in one request, over the per-request limit of "
                            f"{limits.max_request_bytes} bytes", request_id)


def declared_parts(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Parts with their declared keys only (``type`` + ``text`` or ``image_url.url``), order kept."""
    out = []
    for p in parts:
        if p["type"] == "text":
            out.append({"type": "text", "text": p["text"]})
        else:
            out.append({"type": "image_url", "image_url": {"url": p["image_url"]["url"]}})
    return out


def data_url(kind: str, data: bytes) -> str:
    """``data:image/<kind>;base64,...`` of ``data``."""
    return f"data:image/{kind};base64,{base64.b64encode(data).decode('ascii')}"


def image_type(data: bytes) -> str | None:
    """The allowed image type whose signature ``data`` has, or None."""
    return next((k for k, sig in _SIGNATURES.items() if sig(data)), None)


#: Image formats a dataset may hold that are not contract types, by name, so an error can say which one it
#: is (ATM-Bench's processors accept ``.bmp``, ``.tiff`` and ``.dng`` photos: ``memqa/global_config.py``
#: ``IMAGE_PROCESSING_CONFIG``; DNG is TIFF-based; phones write HEIC).
_OTHER_FORMATS: dict[str, Callable[[bytes], bool]] = {
    "BMP": lambda b: b.startswith(b"BM"),
    "TIFF": lambda b: b[:4] in (b"II*\x00", b"MM\x00*"),
    "HEIC": lambda b: b[4:8] == b"ftyp" and b[8:12] in (b"heic", b"heix", b"mif1", b"msf1", b"hevc"),
}


@functools.lru_cache(maxsize=8)
def suite_media_limits(suite: str = "multimodal") -> MediaLimits:
    """The media limits of a shipped suite (``"media"`` in its file; defaults when it sets none).

    The Multimodal adapters check every image against these while loading (:func:`image_problem`), so an
    image the run would refuse is found, with its file and round, before anything is sent.
    """
    from aml_ray.suite import load_suite  # the suite module imports this one

    return load_suite(suite).media or MediaLimits()


def image_problem(data: bytes, limits: MediaLimits) -> str | None:
    """Why an image file cannot be sent as a content part under ``limits``, or None when it can.

    The adapters ask this of every image they read, so one bad image is that item's error (the item is
    Added without it, a question with it is excluded) and never the bundle's; the adapter's message adds
    the file and the round or item.

    Args:
        data: the file's bytes.
        limits: the suite's media limits (types and sizes, :class:`MediaLimits`).

    Returns:
        None, or the reason in words: the type is not allowed (named when known), the file is empty, or it
        is over ``max_image_bytes`` / ``max_request_bytes`` (sizes in bytes).

    Examples:
        >>> image_problem(b"BM" + bytes(60), MediaLimits())
        'a BMP image; allowed: png, jpeg, webp, gif'
        >>> image_problem(b"\\x89PNG\\r\\n\\x1a\\n" + bytes(30), MediaLimits(max_image_bytes=16))
        'image is 38 bytes, over the per-image limit of 16 bytes'
    """
    if not data:
        return "the file is empty"
    kind = image_type(data)
    if kind is None or kind not in limits.image_types:
        name = kind.upper() if kind else next((n for n, sig in _OTHER_FORMATS.items() if sig(data)), None)
        what = f"a {name} image" if name else "not an image of a known type"
        return f"{what}; allowed: {', '.join(limits.image_types)}"
    if len(data) > limits.max_image_bytes:
        return f"image is {len(data)} bytes, over the per-image limit of {limits.max_image_bytes} bytes"
    if len(data) > limits.max_request_bytes:
        return f"image is {len(data)} bytes, over the per-request limit of {limits.max_request_bytes} bytes"
    return None


def escape_text(text: str) -> str:
    """Neutralise anything in participant text that looks like an image marker (it is never an image)."""
    return IMAGE_MARKER.sub(lambda m: "<image media\u200b:" + m.group(1) + ">", text)


class MediaStore:
    """Images of one run, each stored once by content hash: ``<root>/<sha256>.<ext>``.

    Args:
        root: the run's media folder (``<run_dir>/media``); created on the first write. On a multi-node
            cluster it must be storage every node sees, like the rest of the run directory.

    Writes are atomic (temporary file + ``os.replace``) and idempotent, so stages on several processes
    may store the same image at once.
    """

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)

    def put(self, kind: str, data: bytes) -> str:
        """Store ``data`` (type ``kind``) unless present.

        Returns:
            The reference ``media:<sha256>``.
        """
        digest = hashlib.sha256(data).hexdigest()
        path = self.root / f"{digest}.{IMAGE_TYPES[kind]}"
        if not path.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{digest}.", suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        return MEDIA_PREFIX + digest

    def path(self, ref: str) -> Path:
        """The file of ``media:<sha256>``.

        Raises:
            FileNotFoundError: no such image in this run's media folder.
        """
        digest = ref.removeprefix(MEDIA_PREFIX)
        for ext in IMAGE_TYPES.values():
            p = self.root / f"{digest}.{ext}"
            if p.exists():
                return p
        raise FileNotFoundError(f"{ref} is not in {self.root}")

    def read(self, ref: str) -> tuple[str, bytes]:
        """``(type, bytes)`` of a stored image."""
        data = self.path(ref).read_bytes()
        return image_type(data) or "png", data

    def data_url(self, ref: str) -> str:
        """The stored image as a ``data:`` URL (what participants and the answer model receive)."""
        return data_url(*self.read(ref))

    def externalize(self, parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Contract parts -> evidence parts ``{type, text, media}``, storing each image once.

        Args:
            parts: validated parts with ``data:`` URLs.

        Returns:
            ``[{"type": "text", "text": ..., "media": None} | {"type": "image", "text": None,
            "media": "media:<sha256>"}]`` in the same order.
        """
        out = []
        for p in parts:
            if p["type"] == "text":
                out.append({"type": "text", "text": p["text"], "media": None})
            else:
                url = p["image_url"]["url"]
                kind, b64 = url[len("data:image/"):].split(";base64,", 1)
                out.append({"type": "image", "text": None, "media": self.put(kind.lower(), base64.b64decode(b64))})
        return out

    def to_contract(self, parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Evidence parts -> contract parts with ``data:`` URLs (to send a stored query again)."""
        return [{"type": "text", "text": p["text"]} if p["type"] == "text"
                else {"type": "image_url", "image_url": {"url": self.data_url(p["media"])}} for p in parts]


def memories_to_evidence(memories: list[dict[str, Any]], store: MediaStore) -> list[dict[str, Any]]:
    """Search memories -> evidence memories: one returned as parts gets its images stored once by hash.

    Args:
        memories: validated Search memories (``content`` a string, or a list of contract parts).
        store: the run's media store.

    Returns:
        The same memories in order; a parts memory becomes ``{..., "content": <rendered parts>,
        "parts": <evidence parts>}`` (:func:`render_parts`, :meth:`MediaStore.externalize`).
    """
    if not any(isinstance(m["content"], list) for m in memories):
        return memories
    out = []
    for m in memories:
        if isinstance(m["content"], list):
            parts = store.externalize(m["content"])
            m = {**m, "content": render_parts(parts), "parts": parts}
        out.append(m)
    return out


def render_parts(parts: list[dict[str, Any]], sep: str = "\n") -> str:
    """Evidence parts as text: text parts (markers escaped) and ``<image media:<sha256>>`` in order."""
    return sep.join(escape_text(p["text"]) if p["type"] == "text"
                    else f"<image {p['media']}>" for p in parts)


def text_of(content: str | list[dict[str, Any]]) -> str:
    """The text of a content value: the string, or its text parts joined by newlines."""
    if isinstance(content, str):
        return content
    return "\n".join(p["text"] for p in content if p.get("type") == "text")


def image_size(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` from a PNG, GIF, JPEG or WEBP header; None when it cannot be read."""
    try:
        if data.startswith(b"\x89PNG") and len(data) >= 24:
            return struct.unpack(">II", data[16:24])
        if data.startswith(b"GIF") and len(data) >= 10:
            return struct.unpack("<HH", data[6:10])
        if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
            chunk = data[12:16]
            if chunk == b"VP8X":
                w = int.from_bytes(data[24:27], "little") + 1
                h = int.from_bytes(data[27:30], "little") + 1
                return w, h
            if chunk == b"VP8L":
                bits = int.from_bytes(data[21:25], "little")
                return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
            if chunk == b"VP8 ":
                w, h = struct.unpack("<HH", data[26:30])
                return w & 0x3FFF, h & 0x3FFF
        if data.startswith(b"\xff\xd8"):
            i = 2
            while i + 9 < len(data):
                if data[i] != 0xFF:
                    i += 1
                    continue
                marker = data[i + 1]
                if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
                    h, w = struct.unpack(">HH", data[i + 5:i + 9])
                    return w, h
                i += 2 + struct.unpack(">H", data[i + 2:i + 4])[0]
    except struct.error:
        return None
    return None


def openai_image_tokens(width: int, height: int) -> int:
    """Tokens of one image input at ``detail="high"`` by OpenAI's documented tile rule (GPT-4o family).

    Rule (OpenAI vision guide, "Calculating costs"): scale to fit within 2048 x 2048, then scale so the
    shortest side is 768 px (only down), count the 512 px tiles, and charge ``85 + 170 * tiles``.

    Examples:
        >>> openai_image_tokens(1024, 1024)
        765
        >>> openai_image_tokens(1, 1)
        255
    """
    w, h = float(width), float(height)
    if max(w, h) > 2048:
        scale = 2048 / max(w, h)
        w, h = w * scale, h * scale
    if min(w, h) > 768:
        scale = 768 / min(w, h)
        w, h = w * scale, h * scale
    tiles = -(-int(w) // 512) * -(-int(h) // 512)
    return 85 + 170 * max(1, tiles)


def image_token_counter(store: MediaStore, rule: int | str) -> Callable[[str], int]:
    """A function ``media ref -> tokens`` for the answer context budget.

    Args:
        store: the run's media store.
        rule: a fixed number of tokens per image, or ``"openai_tiles"`` (:func:`openai_image_tokens` on
            the image's size; an unreadable header counts as 1,105 tokens, a 2048 x 768 image).
    """
    if isinstance(rule, int):
        return lambda ref: rule

    def count(ref: str) -> int:
        size = image_size(store.read(ref)[1])
        return openai_image_tokens(*size) if size else 1105

    return count
