"""Checking benchmark files as adapters read them: one error that names the file, the item and the field.

Every adapter reads its file through :func:`read_json` / :func:`aml_ray.datasets.jsonl.iter_jsonl` (an
empty file, text that is not JSON and a top level of the wrong type are refused there) and reads each
field of an item through :class:`Where` (a missing field and a field of the wrong type are refused
there). Whatever is wrong, the adapter raises :class:`DatasetFormatError`, whose message reads::

    <file>: <item>: field '<field>': <what is wrong>; expected <what the adapter reads>

e.g. ``locomo10.json: item 0 (sample_id 'conv-26'): field 'qa[3].question': missing; expected a
string``. The item is the entry's 0-based position in the file (``line <n>`` in JSON Lines and CSV
files) with its id when it has one; the field is its path inside the item. The rules of each layout
(which fields are required, which values are allowed) are in the adapter's docstring and come from the
benchmark's MANIFEST.md section; this module only reports them. A file that loads but
leaves a run no scorable question is refused by :func:`require_scorable` (a run must measure something).

Examples:
    >>> item = Where.item_of(0, {"sample_id": "conv-26", "qa": [{"category": 2}]}, "sample_id")
    >>> str(item / "qa" / 0 / "question")
    "item 0 (sample_id 'conv-26'): field 'qa[0].question'"
    >>> (item / "qa" / 0).get({"category": 2}, "question", str)
    Traceback (most recent call last):
    ...
    aml_ray.datasets.validate.DatasetFormatError: item 0 (sample_id 'conv-26'): field 'qa[0].question': missing; expected a string
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from aml_ray.datasets.fetch import DatasetError

#: A JSON type, or a tuple of them, that a field must have.
Kind = type | tuple[type, ...]

_MISSING = object()

_NAMES: dict[type, str] = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
                           list: "a list", dict: "an object", type(None): "null"}


class DatasetFormatError(DatasetError, ValueError):
    """A dataset file that does not hold what its adapter reads.

    The message names the file (once the loader that opened it knows it: :func:`in_file`), the item
    and the field, and says what was expected (format in the module docstring). A ``ValueError`` too,
    so callers that refuse bad input by ``ValueError`` keep doing so.

    Args:
        reason: what is wrong and what was expected, e.g. ``"missing; expected a string"``.
        file: the file, or None until :func:`in_file` adds it.
        item: the item, e.g. ``"item 0 (sample_id 'conv-26')"`` or ``"line 7"``; None for the whole file.
        field: the field's path inside the item, e.g. ``"qa[3].question"``; None for the whole item.
    """

    def __init__(self, reason: str, *, file: str | os.PathLike[str] | None = None, item: str | None = None,
                 field: str | None = None):
        super().__init__(reason)
        self.reason, self.item, self.field = reason, item, field
        self.file = None if file is None else str(file)

    def __str__(self) -> str:
        parts = [p for p in (self.file, self.item) if p]
        if self.field:
            parts.append(f"field {self.field!r}")
        return ": ".join([*parts, self.reason])

    def __reduce__(self):
        return (type(self), (self.reason,), {"file": self.file, "item": self.item, "field": self.field})


def describe(value: Any) -> str:
    """A short description of a JSON value for an error message.

    Examples:
        >>> describe(["When", "?"]), describe([]), describe(None), describe(7)
        ('a list', 'an empty list', 'null', 'an integer 7')
        >>> describe("x" * 50)
        "a string 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...'"
    """
    name = _NAMES.get(type(value), type(value).__name__)
    if isinstance(value, (list, dict)) and not value:
        return f"an empty {name.removeprefix('an ').removeprefix('a ')}"
    if isinstance(value, (list, dict)) or value is None:
        return name
    text = repr(value)
    return f"{name} {text[:41] + '...' + text[-1] if len(text) > 45 else text}"


def expected(kind: Kind) -> str:
    """``"a string"``, ``"a string or an integer"``... for a kind (a type or a tuple of types)."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(_NAMES.get(k, k.__name__) for k in kinds)


def _wanted(kind: Kind, what: str | None, nonempty: bool) -> str:
    if what:
        return what
    return "a non-empty " + expected(kind).removeprefix("an ").removeprefix("a ") if nonempty else expected(kind)


def is_kind(value: Any, kind: Kind) -> bool:
    """``isinstance`` with JSON's rules: true/false is not a number, an integer is a number (float)."""
    if type(value) is kind:  # the common case, without building a tuple (a file's every field comes here)
        return True
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool):
        return bool in kinds
    return isinstance(value, kinds) or (float in kinds and isinstance(value, int))


class Where:
    """A place inside a dataset file: an item and the path of a field in it.

    ``where / key`` is cheap: a place keeps its parent and key and spells its path only when it is read
    (an error message), since an adapter makes one place per field of a file and nearly all of them are
    never read (LoCoMo's 10 samples: about 25,000, the time before a run's first Add).

    Attributes:
        item: the item, e.g. ``"item 3 (question_id 'q7')"`` or ``"line 12"``; empty for the top level.
        path: the field path inside the item, e.g. ``"conversation.session_1[4].speaker"``.
    """

    __slots__ = ("item", "_path", "_parent", "_key")

    def __init__(self, item: str = "", path: str = ""):
        self.item, self._path, self._parent, self._key = item, path, None, None

    @property
    def path(self) -> str:
        """The field path inside the item (spelled on first read)."""
        if self._path is None:
            base, key = self._parent.path, self._key
            self._path = f"{base}[{key}]" if isinstance(key, int) else f"{base}.{key}" if base else key
        return self._path

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Where) and (self.item, self.path) == (other.item, other.path)

    def __hash__(self) -> int:
        return hash((self.item, self.path))

    def __repr__(self) -> str:
        return f"Where(item={self.item!r}, path={self.path!r})"

    @classmethod
    def item_of(cls, index: int, value: Any, id_field: str | None = None, *, noun: str = "item") -> Where:
        """The place of the ``index``-th item of a file, labelled with its id when it has one.

        Args:
            index: 0-based position (or a line number with ``noun="line"``).
            value: the item as decoded (its id is read from ``id_field`` when it is a string or integer).
            id_field: the field holding the item's id, e.g. ``"sample_id"``.
            noun: ``"item"``, ``"line"``...
        """
        label = f"{noun} {index}"
        ident = value.get(id_field) if id_field and isinstance(value, dict) else None
        if is_kind(ident, (str, int)) and str(ident):
            label += f" ({id_field} {ident!r})"
        return cls(label)

    def __truediv__(self, key: str | int) -> Where:
        """The place of a field (``str``) or list element (``int``) inside this one."""
        place = Where.__new__(Where)
        place.item, place._path, place._parent, place._key = self.item, None, self, key
        return place

    def __str__(self) -> str:
        return ": ".join(p for p in (self.item, f"field {self.path!r}" if self.path else "") if p)

    def error(self, reason: str) -> DatasetFormatError:
        """The error for this place (raise it)."""
        return DatasetFormatError(reason, item=self.item or None, field=self.path or None)

    def check(self, value: Any, kind: Kind, what: str | None = None, *, nonempty: bool = False) -> Any:
        """``value`` (the value at this place) when it is of ``kind``, else raise.

        Args:
            value: the value found here.
            kind: the type(s) it must have (:func:`is_kind`).
            what: what is expected, in words (default: the kind's name, e.g. ``"a list"``).
            nonempty: refuse an empty string (blank too) or an empty list or object.

        Returns:
            ``value`` unchanged.

        Raises:
            DatasetFormatError: naming this place, what was expected and what was found.
        """
        if not is_kind(value, kind) or nonempty and (not value.strip() if isinstance(value, str) else
                                                     isinstance(value, (list, dict)) and not value):
            raise self.error(f"expected {_wanted(kind, what, nonempty)}, got {describe(value)}")
        return value

    def get(self, obj: dict[str, Any], key: str, kind: Kind, what: str | None = None, *, required: bool = True,
            nonempty: bool = False, default: Any = None) -> Any:
        """Field ``key`` of ``obj`` (the object at this place), checked by :meth:`check`.

        Args:
            obj: the object at this place (already checked to be a dict).
            key: the field.
            kind / what / nonempty: as for :meth:`check`.
            required: a missing field raises; when False a missing field or null gives ``default``.
            default: the value of an optional field that is missing or null.

        Raises:
            DatasetFormatError: a required field is missing, or the field has another type.
        """
        value = obj.get(key, _MISSING)
        if value is _MISSING or (not required and value is None):
            if required:
                raise (self / key).error(f"missing; expected {_wanted(kind, what, nonempty)}")
            return default
        if type(value) is kind and not nonempty:  # the common case: no place built (one per field of a file)
            return value
        return (self / key).check(value, kind, what, nonempty=nonempty)


@contextlib.contextmanager
def in_file(path: str | os.PathLike[str] | None) -> Iterator[None]:
    """Name ``path`` in every :class:`DatasetFormatError` raised inside (that does not name a file yet).

    A ``None`` path names nothing (parsing decoded data that came from no file).
    """
    try:
        yield
    except DatasetFormatError as exc:
        if exc.file is None and path is not None:
            exc.file = str(path)
        raise


def read_text(path: str | os.PathLike[str], what: str) -> str:
    """A dataset file's text (UTF-8).

    Args:
        path: the file.
        what: what the file must hold, for the message (``"a JSON list of conversations"``).

    Raises:
        DatasetFormatError: the file is empty (blank) or not UTF-8 text.
        OSError: the file cannot be read (FileNotFoundError when it does not exist).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetFormatError(f"not UTF-8 text (byte {exc.start}); expected {what}", file=path) from None
    if not text.strip():
        raise DatasetFormatError(f"empty file; expected {what}", file=path)
    return text


def read_json(path: str | os.PathLike[str], kind: Kind, what: str) -> Any:
    """Decode a JSON file whose top level must be of ``kind``.

    Examples:
        >>> import tempfile
        >>> f = Path(tempfile.mkdtemp()) / "locomo10.json"
        >>> _ = f.write_text('{"sample_id": "conv-26"}')
        >>> read_json(f, list, "a JSON list of conversations")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        aml_ray.datasets.validate.DatasetFormatError: .../locomo10.json: top level: expected a JSON list of conversations, got an object

    Args:
        path: the file.
        kind: the type(s) the top level must have (``list``, ``dict``).
        what: the expected top level in words, for the message.

    Returns:
        The decoded value.

    Raises:
        DatasetFormatError: an empty file, text that is not JSON (with the line and column), or a top
            level of another type; the message names the file.
        OSError: the file cannot be read.
    """
    text = read_text(path, what)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetFormatError(f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); expected {what}",
                                 file=path) from None
    with in_file(path):
        Where("top level").check(value, kind, what)
    return value


def require_scorable(samples: Sequence[Any], file: str | os.PathLike[str], *,
                     limit_samples: int | None = None) -> int:
    """Refuse a dataset that would give a run nothing to measure: no sample, or no scorable question.

    A run of such a file (``[]``, a file whose every question is excluded, or ``--limit-samples N`` whose
    first N samples hold only excluded questions) would Add, find nothing to score and end ``completed``
    without having measured anything; it is an input error instead, found before a run is created.

    Examples:
        >>> require_scorable([], "locomo10.json")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        aml_ray.datasets.validate.DatasetFormatError: locomo10.json: holds no sample; a run would measure nothing: ...

    Args:
        samples: the adapter's samples (:class:`~aml_ray.datasets.base.Sample`), the whole file.
        file: the dataset file, named in the message.
        limit_samples: the run's ``--limit-samples`` (only the first N samples run), or None.

    Returns:
        The number of scorable questions the run would score (> 0).

    Raises:
        DatasetFormatError: nothing to score; the message names the file, why (excluded questions counted
            by reason) and the fix.
    """
    run = list(samples if limit_samples is None else samples[:limit_samples])
    scorable = sum(q.excluded_reason is None for s in run for q in s.questions)
    if scorable:
        return scorable
    if not samples:
        raise DatasetFormatError("holds no sample; a run would measure nothing: pass a file with at least one "
                                 "sample that has a scorable question", file=file)
    reasons = Counter(q.excluded_reason for s in run for q in s.questions)
    n = sum(reasons.values())
    why = (f"{n} question(s), every one excluded ({', '.join(f'{k} {r}' for r, k in sorted(reasons.items()))})"
           if n else "no question at all")
    total = sum(q.excluded_reason is None for s in samples for q in s.questions)
    if len(run) < len(samples) and total:
        raise DatasetFormatError(
            f"the first {len(run)} sample(s) (--limit-samples {limit_samples}) hold no scorable question ({why}); "
            f"a run would measure nothing: the file has {total} scorable question(s) in {len(samples)} sample(s): "
            "raise --limit-samples or drop it", file=file)
    raise DatasetFormatError(f"its {len(samples)} sample(s) hold no scorable question ({why}); a run would measure "
                             "nothing: pass a file with at least one scorable question", file=file)
