"""Benchmark proposals (seed, site map: "Propose a documented benchmark with its task, provenance,
package, and license"; the form asks for the dataset context, evaluation goal and provenance so that
reviewers can assess fit, safety and reproducibility).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import String, Text, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from aml_ray.store.models import Base, new_id, utcnow


class BenchmarkProposal(Base):
    """A proposed benchmark, stored for the admins' reading (``status``: new | accepted | declined)."""

    __tablename__ = "benchmark_proposals"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("prop"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    status: Mapped[str] = mapped_column(String(16), default="new")
    contact_name: Mapped[str] = mapped_column(String(200))
    contact_email: Mapped[str] = mapped_column(String(320))
    benchmark_name: Mapped[str] = mapped_column(String(200))
    track: Mapped[str] = mapped_column(String(32))
    task: Mapped[str] = mapped_column(Text)
    dataset_context: Mapped[str] = mapped_column(Text)
    evaluation_goal: Mapped[str] = mapped_column(Text)
    metrics: Mapped[str] = mapped_column(Text)
    provenance: Mapped[str] = mapped_column(Text)
    source_url: Mapped[str] = mapped_column(String(500))
    package: Mapped[str] = mapped_column(Text)
    license: Mapped[str] = mapped_column(String(200))


def create_proposal(session: Session, fields: dict[str, Any]) -> BenchmarkProposal:
    """Store a proposal (``fields``: the column values of :class:`BenchmarkProposal`, validated by the caller)."""
    row = BenchmarkProposal(**fields)
    session.add(row)
    session.flush()
    return row


def list_proposals(session: Session) -> list[BenchmarkProposal]:
    """Every proposal, newest first."""
    return list(session.scalars(select(BenchmarkProposal).order_by(BenchmarkProposal.created_at.desc())))
