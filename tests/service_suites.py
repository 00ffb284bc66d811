"""A one-bundle copy of the shipped Textual suite (LoCoMo only) for service tests: a full job then runs
the suite's fixed list, which is one small bundle (with ``full_limit_samples=1``, one LoCoMo sample)."""

from __future__ import annotations

import json
import tempfile
from functools import lru_cache
from pathlib import Path

from aml_ray.suite import SUITES_DIR


@lru_cache(maxsize=None)
def locomo_only_suite() -> str:
    """Path of a suite file named ``textual-locomo`` with the Textual suite's LoCoMo bundle only."""
    suite = json.loads((SUITES_DIR / "textual.json").read_text())
    suite["name"] = "textual-locomo"
    suite["bundles"] = [b for b in suite["bundles"] if b["name"] == "locomo"]
    path = Path(tempfile.mkdtemp(prefix="aml-suite-")) / "textual-locomo.json"
    path.write_text(json.dumps(suite))
    return str(path)


@lru_cache(maxsize=None)
def one_bundle_suite(track: str, bundle: str) -> str:
    """Path of a copy of the shipped ``track`` suite (same name and version) holding only ``bundle``: a full
    job then runs that one bundle, and the gate compares it with the same suite identity."""
    return bundles_suite(track, bundle)


@lru_cache(maxsize=None)
def bundles_suite(track: str, *bundles: str) -> str:
    """Path of a copy of the shipped ``track`` suite (same name and version) holding only ``bundles``, in the
    suite's order (name a ``substitute_for`` bundle with its primary: the substitute runs when the primary's
    files are absent)."""
    suite = json.loads((SUITES_DIR / f"{track}.json").read_text())
    suite["bundles"] = [b for b in suite["bundles"] if b["name"] in bundles]
    path = Path(tempfile.mkdtemp(prefix="aml-suite-")) / f"{track}-{'-'.join(bundles)}.json"
    path.write_text(json.dumps(suite))
    return str(path)


#: The gate checks a full job of a one-bundle suite copy run with ``full_limit_samples=1`` fails, and only
#: those: it ran a sample, not the pinned release (``aml_ray.serve_app.gate``).
SAMPLE_LIMIT_CHECKS = {"question_counts", "all_samples"}


def waive_sample_limit(database_url: str, job_id: str) -> None:
    """Mark the review of ``job_id`` as if its gate had passed, so that a test of a one-sample full job can go
    on to approval and the board; call it only after asserting the gate failed on
    :data:`SAMPLE_LIMIT_CHECKS` alone."""
    from sqlalchemy import select

    from aml_ray.store import make_engine, session_factory
    from aml_ray.store.models import Review

    engine = make_engine(database_url)
    with session_factory(engine).begin() as s:
        review = s.scalar(select(Review).where(Review.job_id == job_id))
        checks = {name: c if c["ok"] else {"ok": True, "detail": f"waived by the test: {c['detail']}"}
                  for name, c in review.gate["checks"].items()}
        review.gate = {"passed": True, "checks": checks}
    engine.dispose()
