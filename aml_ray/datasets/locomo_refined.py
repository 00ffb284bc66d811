"""LoCoMo-Refined adapter: ``locomo_refined.json`` -> :class:`~aml_ray.datasets.base.Sample` objects.

Source: mem-eval-suite/LoCoMo_refined ``data/raw/locomo_refined.json`` (third-party pin: commit
``88709119``, sha256 ``1aef6da7...``; schema notes in ``shared/datasets/MANIFEST.md`` section 3.2; the
file itself was not obtainable here). It keeps the LoCoMo layout, so the conversation is read by
:func:`aml_ray.datasets.locomo.parse_sessions` with every LoCoMo mapping rule (one sample per
conversation, sessions in numeric order, dates taken as UTC, ``"<speaker>: <text>"`` content, image
captions as text). The differences, all in the ``qa`` items:

- ``answer`` is a **list of acceptable complete answers**; every item is kept (numbers as text) and a
  prediction is judged against any of them. A missing, empty or non-list answer raises ``ValueError``.
- ``category`` is the string ``"1"``..``"4"`` (ints are accepted and rendered as text), with LoCoMo's
  meaning; category 5 (adversarial) was removed upstream, so there is nothing to exclude and any other
  category raises ``ValueError``.
- ``evidence`` may hold ``;``-joined ids (split as in LoCoMo); ``is_multi_modality`` is not used.
- ``question_id = f"{sample_id}:q{idx:04d}"`` as in LoCoMo (upstream's ``qa_id`` is
  ``"<sample_id>#q<idx:04d>"`` with the same index).
"""

from __future__ import annotations

import json
import os
from typing import Any

from aml_ray.datasets.base import Question, Sample
from aml_ray.datasets.locomo import CATEGORY_NAMES as LOCOMO_CATEGORY_NAMES
from aml_ray.datasets.locomo import parse_evidence, parse_sessions

#: Dataset name used in ids and tables.
DATASET = "locomo_refined"
#: Categories 1-4 keep LoCoMo's meaning (MANIFEST.md 3.2); 5 was removed upstream.
CATEGORY_NAMES = {k: v for k, v in LOCOMO_CATEGORY_NAMES.items() if k != "5"}


def _answers(sample_id: str, idx: int, raw: Any) -> list[str]:
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"LoCoMo-Refined sample {sample_id!r} qa[{idx}]: answer must be a non-empty list of "
                         f"acceptable answers, got {raw!r}")
    answers = []
    for a in raw:
        if isinstance(a, bool) or not isinstance(a, (str, int, float)) or not str(a).strip():
            raise ValueError(f"LoCoMo-Refined sample {sample_id!r} qa[{idx}]: answer item {a!r} is not a "
                             "non-empty string or number")
        answers.append(str(a))
    return answers


def _questions(sample_id: str, qa: list[dict[str, Any]]) -> tuple[Question, ...]:
    questions = []
    for idx, item in enumerate(qa):
        category = str(item.get("category"))
        if category not in CATEGORY_NAMES:
            raise ValueError(f"LoCoMo-Refined sample {sample_id!r} qa[{idx}]: category {item.get('category')!r} "
                             f"is not one of {sorted(CATEGORY_NAMES)}")
        questions.append(Question(
            question_id=f"{sample_id}:q{idx:04d}", sample_id=sample_id, question=item["question"],
            answer=_answers(sample_id, idx, item.get("answer")), category=category,
            evidence=parse_evidence(item.get("evidence", [])),
        ))
    return tuple(questions)


def parse_locomo_refined(data: list[dict[str, Any]]) -> list[Sample]:
    """Turn the decoded ``locomo_refined.json`` list into samples (rules in the module docstring).

    Args:
        data: the file's top-level JSON list, one object per conversation.

    Returns:
        One sample per conversation, in file order.

    Raises:
        ValueError: the layout errors of :func:`aml_ray.datasets.locomo.parse_sessions`, an answer that is
            not a non-empty list, or a category outside 1-4; the message names the sample and the item.
    """
    if not isinstance(data, list):
        raise ValueError(f"LoCoMo-Refined file must hold a JSON list of conversations, got {type(data).__name__}")
    samples = []
    for item in data:
        sample_id = item["sample_id"]
        conv = item["conversation"]
        samples.append(Sample(sample_id=sample_id, sessions=parse_sessions(sample_id, conv),
                              questions=_questions(sample_id, item.get("qa", [])),
                              speakers=(conv["speaker_a"], conv["speaker_b"])))
    return samples


def load_locomo_refined(path: str | os.PathLike[str]) -> list[Sample]:
    """Load ``locomo_refined.json`` from disk (hash and counts are checked by the suite, not here).

    Returns:
        The samples; for the pinned release 10 samples and 1,382 questions (213 / 299 / 68 / 802 in
        categories 1-4, per the third-party counts in MANIFEST.md section 2).

    Raises:
        OSError: the file cannot be read.
        ValueError: invalid JSON or any error of :func:`parse_locomo_refined`.
    """
    with open(path, encoding="utf-8") as f:
        return parse_locomo_refined(json.load(f))
