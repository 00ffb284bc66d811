"""Prompts as versioned data files (``*.j2``, Jinja2), loaded by name and hashed into ``run.json``.

A prompt's identity is the sha256 of its file bytes: changing one character changes the hash, so a run
records exactly which wording answered and judged it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
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
    _template: jinja2.Template = field(repr=False, compare=False, default=None)  # type: ignore[assignment]

    def render(self, **values: object) -> str:
        """Render with the given values; a missing value raises ``jinja2.UndefinedError``."""
        template = self._template or _ENV.from_string(self.text)
        return template.render(**values)


def load_prompt(name_or_path: str | Path) -> Prompt:
    """Load a shipped prompt by name (``"locomo_answer"``) or any template file by path.

    Raises:
        FileNotFoundError: naming the prompt and the shipped names.
    """
    path = Path(name_or_path)
    if not path.suffix:
        path = PROMPT_DIR / f"{name_or_path}.j2"
    if not path.is_file():
        shipped = sorted(p.stem for p in PROMPT_DIR.glob("*.j2"))
        raise FileNotFoundError(f"prompt {str(name_or_path)!r} not found; shipped prompts: {shipped}")
    data = path.read_bytes()
    text = data.decode("utf-8")
    return Prompt(name=path.stem, text=text, sha256=hashlib.sha256(data).hexdigest(), path=str(path),
                  _template=_ENV.from_string(text))
