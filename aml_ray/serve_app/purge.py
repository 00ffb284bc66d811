"""``aml-ray purge``: delete the evidence of jobs finished more than N days ago (registered in :mod:`aml_ray.cli`).

The database is the service's (``AML_DATABASE_URL``, default SQLite under ``AML_DATA_DIR``); the run
directories are looked for under ``--runs-dir`` (default the service's, ``<data dir>/service-runs``) and
nothing outside it is deleted. See :mod:`aml_ray.store.retention` for what is kept and the safety rules.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated, Optional

import typer

from aml_ray.config import DEFAULT_RETENTION_DAYS


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def purge_command(
    older_than_days: Annotated[int, typer.Option(min=0, help="Retention period: purge jobs that finished "
                                                 "more than this many days ago.")] = DEFAULT_RETENTION_DAYS,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only print what would be removed.")] = False,
    runs_dir: Annotated[Optional[Path], typer.Option(help="The service's runs directory; nothing outside it "
                                                     "is deleted (default <data dir>/service-runs).")] = None,
) -> None:
    """Delete evidence (run directories) of service jobs that finished more than N days ago.

    Queued and running jobs are never touched. Scores, reviews and the public leaderboard are kept.
    Each purged job gets an audit row (actor "retention").
    """
    from sqlalchemy import make_url

    from aml_ray.serve_app.settings import default_runs_dir
    from aml_ray.store import database_url, make_engine, session_factory, upgrade
    from aml_ray.store.models import utcnow
    from aml_ray.store.retention import purge_evidence

    url = database_url()
    parsed = make_url(url)
    shown_db = parsed.render_as_string(hide_password=True)
    if parsed.drivername.startswith("sqlite") and parsed.database and not Path(parsed.database).exists():
        typer.echo(f"no service database at {parsed.database}: nothing to purge")
        return
    root = (runs_dir or default_runs_dir()).expanduser()
    now = utcnow()
    cutoff = now - timedelta(days=older_than_days)
    engine = make_engine(url)
    try:
        upgrade(engine)
        typer.echo(f"{'dry run: ' if dry_run else ''}evidence of jobs finished before {cutoff:%Y-%m-%d %H:%M} UTC "
                   f"({older_than_days} days), database {shown_db}, runs under {root}")
        removed = skipped = files = size = 0
        for item in purge_evidence(session_factory(engine), root, older_than_days=older_than_days,
                                   dry_run=dry_run, now=now):
            typer.echo(f"  {item.job_id}  {item.status:<9}  finished {item.finished_at:%Y-%m-%d}  "
                       f"{item.run_dir}  {item.files} files, {_human(item.bytes)}  {item.action}")
            if item.skipped:
                skipped += 1
            else:
                removed += 1
                files += item.files
                size += item.bytes
        if removed == skipped == 0:
            typer.echo("nothing to purge")
            return
        done = "would remove" if dry_run else "removed"
        typer.echo(f"{done} the evidence of {removed} job(s): {files} files, {_human(size)}"
                   + (f"; {skipped} skipped" if skipped else ""))
    finally:
        engine.dispose()
