"""memctl export / memctl import: the whole memory as one JSONL stream, out and in."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from memctl.files import jsonl
from memctl.cli.common import FormatOption, connect, settings, warn
from memctl.cli.render import Format, render
from memctl.errors import InvalidInput
from memctl.records import filters
from memctl.transfer import export as export_mod, import_ as import_mod

if TYPE_CHECKING:
    from memctl.db.memory import Memory


def register(root: typer.Typer) -> None:
    root.command("export")(export)
    root.command("import")(import_)


def export(
    out: Annotated[
        str, typer.Option("--out", "-o", help="File to write, or '-' for stdout.")
    ] = "-",
    agent: Annotated[
        Optional[str], typer.Option("--agent", "-a", help="Only this agent's episodes and runs.")
    ] = None,
    since: Annotated[
        Optional[str],
        typer.Option(
            "--since",
            help="Only episodes, lineage and runs newer than a duration (7d) or ISO date.",
        ),
    ] = None,
    vectors: Annotated[
        bool,
        typer.Option(
            "--vectors",
            help="Add the active model's vectors, so an import into a database with that model "
            "need not embed again.",
        ),
    ] = False,
) -> None:
    """Write facts with their history, episodes, summary lineage, blocked sources and runbook runs as JSONL.

    A header line first (format version, memctl version, models), then one object per record, from one
    consistent snapshot, streamed in constant memory. Facts and blocked sources are always exported whole.
    """
    from memctl.records import jobs

    when = filters.parse_since(since) if since else None
    conn = connect(vector=False)
    with jobs.record(
        conn, "export"
    ) as job:  # where it went: an erasure's receipt lists the exports before it
        job.detail = {"file": out if out == "-" else str(Path(out).resolve())}
        result = _export(conn, out, agent, when, vectors)
        job.rows = result.episodes + result.facts
    counts = ", ".join(f"{n} {name.replace('_', ' ')}" for name, n in result.to_dict().items())
    warn(f"exported {counts}")


def _export(conn: Memory, out: str, agent, when, vectors: bool):
    if out == "-":
        result = export_mod.export(conn, sys.stdout.write, agent=agent, since=when, vectors=vectors)
    else:  # private (0600) from the first byte, fsynced, renamed into place whole
        from memctl import files

        files.regular_target(out, "--out")
        try:
            with files.atomic_write(out) as handle:
                result = export_mod.export(
                    conn, handle.write, agent=agent, since=when, vectors=vectors
                )
        except OSError as exc:
            raise InvalidInput(f"cannot write {out}: {exc.strerror}") from None
    return result


def import_(
    file: Annotated[str, typer.Argument(help="An export (memctl export), or '-' for stdin.")],
    fmt: FormatOption = Format.table,
) -> None:
    """Load an export into this database, empty or not, in one transaction.

    Episodes already here (same agent, content hash and created_at) are skipped, fact histories merged in
    version order, lineage and runs remapped to the new episode ids, secrets redacted. A corrupt or unknown
    line fails the import, names the line, and leaves nothing behind; an export of a newer format is refused.
    """
    from memctl import redact

    st = settings()
    redactor = redact.Redactor.from_settings(st)
    handle = jsonl.open_input(file)
    try:
        from memctl.write import values

        lines = jsonl.bounded(
            handle, values.Limits.of(st).export_line_bytes(), "an export's line within [limits]"
        )
        result = import_mod.import_stream(connect(), lines, redactor=redactor)
    finally:
        handle.close()
    if note := redactor.note():
        warn(note)
    if result.erased:
        from memctl.cli.erasure import erased_note

        warn(erased_note(result.erased))
    render([result.to_dict()], fmt)
