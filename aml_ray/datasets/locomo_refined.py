"""LoCoMo-Refined adapter: ``locomo_refined.json`` -> :class:`~aml_ray.datasets.base.Sample` objects.

Source: mem-eval-suite/LoCoMo_refined ``data/raw/locomo_refined.json`` (third-party pin: commit
``88709119``, sha256 ``1aef6da7...``; schema notes in ``shared/datasets/MANIFEST.md`` section 3.2; the
file itself was not obtainable here). It keeps the LoCoMo layout, so the conversation is read by
:func:`aml_ray.datasets.locomo.parse_sessions` with every LoCoMo mapping rule (one sample per
conversation, sessions in numeric order, dates taken as UTC, ``"<speaker>: <text>"`` content, image
captions as text). The differences, all in the ``qa`` items:

- ``answer`` is a **list of acceptable complete answers**; every item is kept (numbers as text) and a
  prediction is judged against any of them. A missing, empty or non-list answer raises
  ``DatasetFormatError``.
- ``category`` is the string ``"1"``..``"4"`` (ints are accepted and rendered as text), with LoCoMo's
  meaning; category 5 (adversarial) was removed upstream, so there is nothing to exclude and any other
  category raises ``DatasetFormatError``.
- ``evidence`` may hold ``;``-joined ids (split as in LoCoMo); ``is_multi_modality`` is not used.
- ``question_id = f"{sample_id}:q{idx:04d}"`` as in LoCoMo (upstream's ``qa_id`` is
  ``"<sample_id>#q<idx:04d>"`` with the same index).
"""

from __future__ import annotations

import os
from typing import Any

from aml_ray.datasets.base import Question, Sample
from aml_ray.datasets.locomo import CATEGORY_NAMES as LOCOMO_CATEGORY_NAMES
from aml_ray.datasets.locomo import parse_conversation, parse_evidence, parse_sessions
from aml_ray.datasets.validate import Where, in_file, read_json

#: Dataset name used in ids and tables.
DATASET = "locomo_refined"
#: Categories 1-4 keep LoCoMo's meaning (MANIFEST.md 3.2); 5 was removed upstream.
CATEGORY_NAMES = {k: v for k, v in LOCOMO_CATEGORY_NAMES.items() if k != "5"}


def _answers(raw: Any, where: Where) -> list[str]:
    where.check(raw, list, "a non-empty list of acceptable answers", nonempty=True)
    answers = []
    for i, a in enumerate(raw):
        (where / i).check(a, (str, int, float), "a non-empty string or number", nonempty=isinstance(a, str))
        answers.append(str(a))
    return answers


def _questions(sample_id: str, qa: list[Any], where: Where) -> tuple[Question, ...]:
    questions = []
    for idx, item in enumerate(qa):
        here = where / idx
        here.check(item, dict, "a question object {question, answer, category, evidence}")
        raw_category = here.get(item, "category", (str, int))
        category = str(raw_category)
        if category not in CATEGORY_NAMES:
            raise (here / "category").error(f"category {raw_category!r} is not one of {sorted(CATEGORY_NAMES)}")
        questions.append(Question(
            question_id=f"{sample_id}:q{idx:04d}", sample_id=sample_id,
            question=here.get(item, "question", str, nonempty=True),
            answer=_answers(here.get(item, "answer", list, "a non-empty list of acceptable answers"),
                            here / "answer"),
            category=category,
            evidence=parse_evidence(here.get(item, "evidence", list, required=False, default=[]), here / "evidence"),
        ))
    return tuple(questions)


def parse_locomo_refined(data: list[dict[str, Any]]) -> list[Sample]:
    """Turn the decoded ``locomo_refined.json`` list into samples (rules in the module docstring).

    Args:
        data: the file's top-level JSON list, one object per conversation.

    Returns:
        One sample per conversation, in file order.

    Raises:
        DatasetFormatError: the layout errors of :func:`aml_ray.datasets.locomo.parse_locomo`, an answer
            that is not a non-empty list of strings or numbers, or a category outside 1-4; the message
            names the item (index and sample_id) and the field.
    """
    Where("top level").check(data, list, "a JSON list of conversations")
    samples = []
    for index, item in enumerate(data):
        sample_id, conv, where = parse_conversation(index, item)
        samples.append(Sample(sample_id=sample_id, sessions=parse_sessions(sample_id, conv, where / "conversation"),
                              questions=_questions(sample_id, where.get(item, "qa", list, required=False,
                                                                        default=[]), where / "qa"),
                              speakers=(conv["speaker_a"], conv["speaker_b"])))
    return samples


def load_locomo_refined(path: str | os.PathLike[str]) -> list[Sample]:
    """Load ``locomo_refined.json`` from disk (hash and counts are checked by the suite, not here).

    Returns:
        The samples; for the pinned release 10 samples and 1,382 questions (213 / 299 / 68 / 802 in
        categories 1-4, per the third-party counts in MANIFEST.md section 2).

    Raises:
        OSError: the file cannot be read.
        DatasetFormatError: an empty file, invalid JSON or any error of :func:`parse_locomo_refined`; the
            message names the file.
    """
    data = read_json(path, list, "a JSON list of conversations")
    with in_file(path):
        return parse_locomo_refined(data)
