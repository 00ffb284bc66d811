"""Dataset-neutral shapes every benchmark adapter produces.

An adapter turns a benchmark file into :class:`Sample` objects: one sample = one user_id (the AML
isolation boundary), holding its sessions in source order and its questions. The chunker
(:mod:`aml_ray.datasets.chunking`) turns sessions into :class:`Chunk` objects, one Add request each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aml_ray.contract import Message


@dataclass(frozen=True, slots=True)
class Session:
    """One source session of a sample.

    Attributes:
        key: the source's session name, e.g. ``"session_3"``; used in the session_id.
        index: 1-based numeric position among the sample's sessions (``session_10`` after ``session_9``).
        started_at_ms: the session's date as UTC Unix milliseconds.
        messages: the session's messages in source order, each with its timestamp in ms.
    """

    key: str
    index: int
    started_at_ms: int
    messages: tuple[Message, ...]


def turn_ids(session: Session) -> list[str]:
    """The platform's ids of a session's turns: ``D<session index>:<1-based position>``.

    This is LoCoMo's ``dia_id`` convention (``D8:6`` = the 6th turn of session 8), which the LoCoMo adapter's
    sessions follow exactly; every other dataset's turns get ids of the same form, so Add evidence can name
    the turns each chunk carried and evidence recall can resolve turn-level evidence
    (:mod:`aml_ray.scoring.evidence_recall`).
    """
    return [f"D{session.index}:{i}" for i in range(1, len(session.messages) + 1)]


@dataclass(frozen=True, slots=True)
class Question:
    """One benchmark question.

    Attributes:
        question_id: stable id within the dataset, e.g. ``"conv-26:q0007"``.
        sample_id: the sample whose memory answers it.
        question: the original question text (sent to Search unchanged).
        answer: the gold answer as text (numbers rendered as text), a list of acceptable answers, or
            None when the source has none (LoCoMo category 5).
        category: the question type as a string (LoCoMo: ``"1"``..``"5"``).
        evidence: source evidence ids (LoCoMo ``dia_id`` values), for audit only; never sent out.
        excluded_reason: why the question is not scored (e.g. ``"adversarial"``), or None if scored.
        options: multiple-choice options sent to Search, or None for open questions.
        question_date: the question's reference time as text for the answer prompt (LongMemEval's
            ``question_date``), or None.
        rubric: rubric items for rubric-judged datasets (BEAM, CL-bench), else empty.
        step: Streaming mode: the ingestion step (number of units added) at which the question is
            searched; None outside Streaming.
        question_parts: Multimodal: the question as contract content parts (text and ``data:`` image
            URLs), sent to Search and the answer model instead of ``question``; None for a text question.
    """

    question_id: str
    sample_id: str
    question: str
    answer: str | list[str] | None
    category: str
    evidence: tuple[str, ...] = ()
    excluded_reason: str | None = None
    options: tuple[str, ...] | None = None
    question_date: str | None = None
    rubric: tuple[str, ...] = ()
    step: int | None = None
    question_parts: tuple[dict, ...] | None = None


@dataclass(frozen=True, slots=True)
class Sample:
    """One unit of ingestion (one user_id): its sessions in order and its questions.

    Attributes:
        notes: what the adapter changed to load the source as it stands (``"haystack_sessions[4][2]:
            empty turn skipped"``), for run.json (:func:`load_notes`); empty when nothing was changed.
    """

    sample_id: str
    sessions: tuple[Session, ...]
    questions: tuple[Question, ...]
    speakers: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def load_notes(samples: list[Sample]) -> list[dict[str, str]]:
    """Every sample's load notes, for run.json: ``[{"sample_id", "note"}, ...]`` in sample order.

    Examples:
        >>> load_notes([Sample("q1", (), (), notes=("haystack_sessions[0][1]: empty turn skipped",))])
        [{'sample_id': 'q1', 'note': 'haystack_sessions[0][1]: empty turn skipped'}]
    """
    return [{"sample_id": s.sample_id, "note": note} for s in samples for note in s.notes]


@dataclass(frozen=True, slots=True)
class Chunk:
    """One Add request's worth of messages.

    Attributes:
        sample_id: owning sample.
        session_key: source session (a chunk never spans two sessions).
        index: 0-based position of the chunk within the sample (``chunk-<index>`` in the request_id).
        messages: ordered messages, timestamps unchanged.
    """

    sample_id: str
    session_key: str
    index: int
    messages: tuple[Message, ...] = field(default_factory=tuple)
