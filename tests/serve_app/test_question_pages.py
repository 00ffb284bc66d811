"""The per-question drill-down shows each question's evidence recall (HTTP through the app, in-process).

The job's run directory holds evidence written by the run's own writers: question rows of real LoCoMo
questions (:class:`aml_ray.run.evidence.QuestionWriter`) and the recall rows
:func:`aml_ray.scoring.evidence_recall.recall_rows` makes of them, in ``evidence/recall.parquet`` as a run
writes it. A second bundle stands for a dataset without evidence ids (PersonaMem's questions name none):
LoCoMo's questions with their ids dropped.
"""

from __future__ import annotations

import dataclasses
import re

import pyarrow as pa
import pytest
from cryptography.fernet import Fernet
from fastapi.testclient import TestClient
from pydantic import SecretStr

from aml_ray.datasets.base import turn_ids
from aml_ray.datasets.registry import get_dataset
from aml_ray.run.evidence import QUESTION_SCHEMA, QuestionWriter, RunDir, to_table, write_parquet_atomic
from aml_ray.scoring.evidence_recall import recall_rows
from aml_ray.serve_app.app import create_app
from aml_ray.serve_app.settings import ServiceSettings
from aml_ray.store.jobs import create_job, mark_completed, mark_running
from aml_ray.store.synthetic import SYNTHETIC_EDITION, approved_key

FILLER = "a note about the weather on an unrelated planet"


def write_bundle(bundle_dir, sample, questions) -> None:
    """Question evidence for ``questions`` of ``sample`` and its recall rows: the first question's Search
    returned its evidence turns at rank 2, the second's returned filler only, the third's Search failed."""
    turns = {tid: m.content for s in sample.sessions for tid, m in zip(turn_ids(s), s.messages)}
    rows = []
    for i, q in enumerate(questions):
        gold_turns = "\n".join(turns[e] for e in q.evidence if e in turns)
        memories = [{"id": "m1", "content": FILLER, "score": 0.9},
                    {"id": "m2", "content": gold_turns or FILLER, "score": 0.5}] if i == 0 else \
            [{"id": "m1", "content": FILLER, "score": 0.7}] if i == 1 else None
        ok = memories is not None
        rows.append({"dataset": "locomo", "sample_id": sample.sample_id, "question_id": q.question_id,
                     "user_id": "u1", "question": q.question, "gold": str(q.answer), "category": q.category,
                     "excluded": False, "search_status": "ok" if ok else "error", "memories": memories,
                     "n_memories": len(memories) if ok else None, "search_error": None if ok else "HTTP 503",
                     "answer": "an answer" if ok else None, "verdict": "WRONG" if ok else None,
                     "judge_raw": '{"label": "WRONG"}' if ok else None, "score": 0.0 if ok else None,
                     "status": "scored" if ok else "search_error"})
    run_dir = RunDir(bundle_dir)
    QuestionWriter(run_dir).write(to_table(rows, QUESTION_SCHEMA))
    write_parquet_atomic(pa.Table.from_pylist(list(recall_rows([sample], rows))), run_dir.recall)


@pytest.fixture(scope="module")
def drill(tmp_path_factory, locomo_file):
    """(client with the job owner's page session, drill-down URL of the LoCoMo bundle, of the one without
    evidence ids, the questions' ids)."""
    tmp = tmp_path_factory.mktemp("drill")
    sample = get_dataset("locomo").load(locomo_file)[0]
    questions = [q for q in sample.questions if q.evidence][:3]
    write_bundle(tmp / "run" / "locomo", sample, questions)
    bare = [dataclasses.replace(q, evidence=()) for q in questions]
    write_bundle(tmp / "run" / "personamem", dataclasses.replace(sample, questions=bare), bare)
    settings = ServiceSettings(database_url=f"sqlite:///{tmp / 'aml.sqlite3'}",
                               master_keys=[SecretStr(Fernet.generate_key().decode())], run_worker=False,
                               health_check=False, runs_dir=tmp / "runs")
    with TestClient(create_app(settings)) as client:
        with client.app.state.service.sessions.begin() as session:
            key, key_id, version = approved_key(session, system="Drill Probe")
            job = create_job(session, key_id=key_id, version=version, mode="smoke", run_label="smoke-1",
                             edition=SYNTHETIC_EDITION)
            mark_running(job, run_dir=str(tmp / "run"))
            job.bundles = [{"name": n, "dataset": n, "status": "ran", "progress": 1.0}
                           for n in ("locomo", "personamem")]
            mark_completed(session, job)
            job_id = job.id
        assert client.post("/evaluate/key", data={"key": key}, follow_redirects=False).status_code == 303
        base = f"/evaluate/jobs/{job_id}/datasets"
        yield client, f"{base}/locomo", f"{base}/personamem", [q.question_id for q in questions]


def text_of(html: str, element_id: str) -> str:
    """The text of the element with ``element_id`` (tags dropped, whitespace runs as one space)."""
    found = re.search(rf'id="{element_id}"[^>]*>(.*?)</(p|table|dd)>', html, re.S)
    assert found, f'the page has no element id="{element_id}"'
    return " ".join(re.sub(r"<[^>]+>", " ", found.group(1)).split())


def test_a_question_page_shows_its_evidence_recall_by_rule_and_k(drill):
    client, locomo, _, (hit, miss, failed) = drill
    page = client.get(f"{locomo}/questions/{hit}")
    assert page.status_code == 200
    assert text_of(page.text, "recall") == (
        "recall@K = evidence units covered by the first K memories; fuzzy (the headline): half of a turn's content "
        "words in a memory; exact: the turn's text in a memory. Rule @1 @5 @10 @25 @100 "
        "fuzzy 0.00 1.00 1.00 1.00 1.00 exact 0.00 1.00 1.00 1.00 1.00")  # the gold turns came at rank 2
    assert text_of(page.text, "recall-summary") == \
        "1 evidence unit; first memory that covers one: rank 2 (fuzzy rule), rank 2 (exact rule)."
    page = client.get(f"{locomo}/questions/{miss}")
    assert "fuzzy 0.00 0.00 0.00 0.00 0.00" in text_of(page.text, "recall")
    assert "first memory that covers one: none (fuzzy rule), none (exact rule)" in text_of(page.text, "recall-summary")
    page = client.get(f"{locomo}/questions/{failed}")
    assert text_of(page.text, "recall-note") == "No evidence recall: the question was excluded or its Search failed."
    assert 'id="recall"' not in page.text

    listed = client.get(locomo).text  # the list shows recall@10 per question
    cells = dict(re.findall(r'data-question="([^"]+)".*?<td class="num recall">([^<]*)</td>', listed, re.S))
    assert cells == {hit: "1.00", miss: "0.00", failed: "-"}
    assert 'id="recall-note"' not in listed


def test_a_dataset_without_evidence_ids_says_so(drill):
    client, _, bare, (hit, _, _) = drill
    page = client.get(f"{bare}/questions/{hit}")
    assert page.status_code == 200 and 'id="memories"' in page.text
    assert text_of(page.text, "recall-note") == "No evidence ids in this dataset."
    listed = client.get(bare).text
    assert text_of(listed, "recall-note") == "No evidence ids in this dataset."
    assert re.findall(r'<td class="num recall">([^<]*)</td>', listed) == ["-", "-", "-"]


def test_the_recall_module_examples_hold():
    import doctest

    from aml_ray.serve_app import question_recall

    assert doctest.testmod(question_recall).failed == 0
