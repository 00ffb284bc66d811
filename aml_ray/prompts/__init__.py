"""Prompts as versioned data files (``*.j2``, Jinja2), loaded by name and hashed into ``run.json``.

A prompt's identity is the sha256 of its file bytes: changing one character changes the hash, so a run
records exactly which wording answered and judged it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2

PROMPT_DIR = Path(__file__).parent
_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)


@dataclass(frozen=True)
class Prompt:
    """A loaded prompt template.

    Attributes:
        name: file stem, e.g. ``"locomo_answer"``.
        text: the template source.
        sha256: hex digest of the file bytes.
        path: where it was loaded from.
    """

    name: str
    text: str
    sha256: str
    path: str

    def render(self, **values: object) -> str:
        """Render with the given values; a missing value raises ``jinja2.UndefinedError``."""
        return _compile(self.text).render(**values)


@lru_cache(maxsize=64)
def _compile(text: str) -> jinja2.Template:
    return _ENV.from_string(text)


class PromptHashMismatch(ValueError):
    """A prompt file's sha256 is not the pinned one."""


def load_prompt(name_or_path: str | Path, sha256: str | None = None) -> Prompt:
    """Load a shipped prompt by name (``"locomo_answer"``), a template file by path, or a URL.

    Args:
        name_or_path: a shipped name, a file path, or an ``http(s)://`` URL (fetched once into the cache).
        sha256: the pinned hash; required for a URL, checked for any source when given.

    Raises:
        FileNotFoundError: naming the prompt and the shipped names.
        PromptHashMismatch: the bytes do not have the pinned hash.
        ValueError: a URL without a pinned sha256.
    """
    ref = str(name_or_path)
    if ref.startswith(("http://", "https://")):
        if not sha256:
            raise ValueError(f"prompt URL {ref} needs a pinned sha256 (suites pin every remote prompt)")
        from aml_ray.config import cache_dir
        from aml_ray.datasets.fetch import fetch_to_cache

        path = cache_dir() / "prompts" / f"{sha256}.j2"
        if not path.is_file():
            fetch_to_cache(ref, path, sha256)
    else:
        path = Path(name_or_path)
        if not path.suffix:
            path = PROMPT_DIR / f"{name_or_path}.j2"
    if not path.is_file():
        shipped = sorted(p.stem for p in PROMPT_DIR.glob("*.j2"))
        raise FileNotFoundError(f"prompt {ref!r} not found; shipped prompts: {shipped}")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if sha256 and digest != sha256:
        raise PromptHashMismatch(f"prompt {ref}: sha256 is {digest}, the pin is {sha256}; use the pinned file "
                                 "or update the pin in the suite")
    text = data.decode("utf-8")
    _compile(text)  # a syntax error surfaces at load time, not in the middle of a run
    return Prompt(name=path.stem, text=text, sha256=digest, path=str(path))
