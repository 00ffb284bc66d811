"""Judge protocols: a judge prompt's wording together with how its replies are read and credited.

A protocol is named by its prompt file: a judge prompt (``aml_ray/prompts/*.j2``) that belongs to a
protocol other than the default says so in a Jinja comment, ``{#- judge protocol: <name> ... -#}``,
which is part of the file's bytes and so of the sha256 a suite pins. The scorer reads the declaration
from the prompt it is given (:func:`protocol_of`), so the suite's choice of prompt is the choice of
protocol; a suite also names the protocol on its bundle (``judge_protocol``, checked against the prompt
by :class:`aml_ray.suite.Bundle`) and the run records it (run.json ``bundle.judge_protocol``).

Protocols (:data:`PROTOCOLS`):

- ``aml-ray`` (the default, every prompt without a declaration): this platform's wording and reading
  (:func:`aml_ray.scoring.parse_judge_label`, re-asks for an unparsable reply); for BEAM its rubric
  credit is upstream's (``int`` of each item score, :mod:`aml_ray.stages.rubric`).
- ``longmemeval-upstream``: LongMemEval's own per-type yes/no prompts, read as upstream reads them
  (:func:`read_yes_no`), 10 completion tokens, upstream's judge model ``gpt-4o-2024-08-06``. Source:
  xiaowu0162/LongMemEval ``src/evaluation/evaluate_qa.py`` (``get_anscheck_prompt``; ``label = 'yes' in
  eval_response.lower()``; ``max_tokens=10``, ``temperature=0``; ``model_zoo['gpt-4o']``).
- ``beam-half-credit``: BEAM's rubric judge with every item credited 1 / 0.5 / 0 (the scale its prompt
  states) instead of upstream's ``int()``; the wording is the default BEAM prompt's.
- ``strict``: a binary judge that credits only a single, unhedged answer that states the gold and adds no
  reasoning (``judge_strict``), read as the default reads it; one of the judge panel's protocols
  (:mod:`aml_ray.scoring.panel`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

#: The protocol of a prompt that declares none.
DEFAULT_PROTOCOL = "aml-ray"

_DECLARATION = re.compile(r"\{#-?\s*judge protocol:\s*([A-Za-z0-9._-]+)")


@dataclass(frozen=True)
class JudgeProtocol:
    """How one family of judge prompts is read.

    Attributes:
        name: the protocol's name (what a prompt declares and a suite bundle names).
        label: one line for run.json and table captions.
        scorer: the registered scorer it applies to (:mod:`aml_ray.stages.scorers`), None for any.
        prompt: the shipped prompt that declares it, None for the default.
        reply: how a reply is read: ``"label"`` (CORRECT/WRONG, :func:`aml_ray.scoring.parse_judge_label`),
            ``"yes_in_lowercase"`` (:func:`read_yes_no`) or ``"rubric_score"`` (BEAM item scores).
        credit: the rubric item credit rule (``"upstream_int"`` or ``"half_credit"``), None where no
            rubric is judged.
        max_tokens: the completion limit of one judge reply, None for the scorer's own.
        judge_model: the judge model upstream used, None when the protocol names none; a run with
            another judge model is reported as not reproducing upstream's numbers.
        source: where the rule comes from.
    """

    name: str
    label: str
    scorer: str | None
    prompt: str | None
    reply: Literal["label", "yes_in_lowercase", "rubric_score"]
    credit: Literal["upstream_int", "half_credit"] | None
    max_tokens: int | None
    judge_model: str | None
    source: str


PROTOCOLS: dict[str, JudgeProtocol] = {p.name: p for p in (
    JudgeProtocol(DEFAULT_PROTOCOL, "aml-ray judge prompts and reading (the platform default)", None, None, "label",
                  None, None, None, "aml_ray/prompts (this project)"),
    JudgeProtocol("longmemeval-upstream", "LongMemEval upstream yes/no judge (evaluate_qa.py wording and reading)",
                  "category_judge", "longmemeval_judge_upstream", "yes_in_lowercase", None, 10, "gpt-4o-2024-08-06",
                  "xiaowu0162/LongMemEval src/evaluation/evaluate_qa.py get_anscheck_prompt and its main loop"),
    JudgeProtocol("beam-half-credit", "BEAM rubric judge, items credited 1 / 0.5 / 0 (aml-ray variant)",
                  "rubric_judge", "beam_rubric_judge_half_credit", "rubric_score", "half_credit", None, None,
                  "aml-ray; BEAM's prompt scale (src/prompts.py unified_llm_judge_base_prompt) without int()"),
    JudgeProtocol("strict", "strict binary judge: one unhedged answer stating the gold, no reasoning (aml-ray)",
                  None, "judge_strict", "label", None, None, None, "aml_ray/prompts/judge_strict.j2 (this project)"),
)}


def get_protocol(name: str) -> JudgeProtocol:
    """The protocol called ``name``.

    Raises:
        ValueError: unknown name; the message lists the known ones.
    """
    try:
        return PROTOCOLS[name]
    except KeyError:
        raise ValueError(f"unknown judge protocol {name!r}; known: {sorted(PROTOCOLS)}") from None


def declared_protocol(text: str) -> str:
    """The protocol a prompt's text declares, or :data:`DEFAULT_PROTOCOL`.

    Examples:
        >>> declared_protocol("{#- judge protocol: longmemeval-upstream (evaluate_qa.py) -#}\\nQuestion: ...")
        'longmemeval-upstream'
        >>> declared_protocol("Question: {{ question }}")
        'aml-ray'
    """
    m = _DECLARATION.search(text)
    return m.group(1) if m else DEFAULT_PROTOCOL


def protocol_of(prompt) -> JudgeProtocol:
    """The protocol of a loaded prompt (:class:`aml_ray.prompts.Prompt`; anything with ``text``).

    Raises:
        ValueError: the prompt declares a protocol that does not exist.
    """
    return get_protocol(declared_protocol(getattr(prompt, "text", "") or ""))


def read_yes_no(text: str | None) -> str:
    """A LongMemEval upstream judge reply as a verdict: ``CORRECT`` when ``'yes'`` is in it, lower-cased.

    Upstream's rule exactly (``evaluate_qa.py``: ``label = 'yes' in eval_response.lower()``), quirks
    included: "I would not say yes" is CORRECT, an empty reply is WRONG. It never fails, so a reply is
    never asked again.

    Examples:
        >>> read_yes_no("Yes."), read_yes_no("no"), read_yes_no("")
        ('CORRECT', 'WRONG', 'WRONG')
    """
    return "CORRECT" if "yes" in str(text or "").strip().lower() else "WRONG"
