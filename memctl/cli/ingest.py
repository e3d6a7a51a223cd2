"""memctl ingest: a log stream into episodes as it arrives (docs/ingest.md)."""

from __future__ import annotations

import sys
from enum import Enum
from typing import Annotated, Optional

import typer

from memctl import interrupts

from memctl.files import jsonl
from memctl.cli.common import connect, settings, warn


class LogFormat(str, Enum):
    lines = "lines"
    jsonl = "jsonl"
    journal = "journal"
    syslog = "syslog"


class Group(str, Enum):
    none = "none"
    blank = "blank"
    gap = "gap"


def register(root: typer.Typer) -> None:
    root.command("ingest")(ingest)


def ingest(
    file: Annotated[str, typer.Argument(help="A log file, or '-' (default) for stdin.")] = "-",
    fmt: Annotated[
        LogFormat,
        typer.Option(
            "--format",
            "-f",
            help="lines (one episode a line), jsonl (episode import's), journal (journalctl -o json), "
            "syslog (RFC 5424 / 3164).",
        ),
    ] = LogFormat.lines,
    source: Annotated[
        Optional[str],
        typer.Option(
            "--source", "-s", help="Source of records that name none (lines: every record)."
        ),
    ] = None,
    kind: Annotated[
        Optional[str], typer.Option("--kind", help="Kind of records that name none (default log).")
    ] = None,
    agent: Annotated[
        Optional[str], typer.Option("--agent", "-a", help="Agent of records that name none.")
    ] = None,
    flush: Annotated[
        float,
        typer.Option(
            "--flush",
            min=0.05,
            max=3600,
            help="Seconds a record waits at most before its batch is stored (sooner once the input is quiet "
            "for 0.1 s).",
        ),
    ] = 1.0,
    group: Annotated[
        Group,
        typer.Option(
            "--group",
            help="lines: one episode a line (none), lines up to a blank line (blank), or lines up to a "
            "pause of --gap seconds (gap).",
        ),
    ] = Group.none,
    gap: Annotated[
        float, typer.Option("--gap", min=0.01, max=3600, help="Seconds of quiet that end a group.")
    ] = 2.0,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            help="FILE: keep reading as it grows, and from the start of a new file when it is rotated.",
        ),
    ] = False,
    cursor_file: Annotated[
        Optional[str],
        typer.Option(
            "--cursor-file",
            help="Resume where the last stored batch ended: a byte offset in FILE, or journald's "
            "__CURSOR (--format journal). Kept in the database with each batch; written here "
            "after each commit.",
        ),
    ] = None,
    journal_unit: Annotated[
        Optional[str],
        typer.Option(
            "--journal-unit",
            help="Follow this systemd unit's journal (runs journalctl -f -o json; implies --format "
            "journal; with --cursor-file it resumes after the last stored entry, else starts "
            "at the journal's end).",
        ),
    ] = None,
    max_line: Annotated[
        Optional[int],
        typer.Option(
            "--max-line",
            min=1024,
            max=64 << 20,
            help="Bytes a line may have; a longer one is reported and skipped "
            "(default: what a record within \\[limits] takes).",
        ),
    ] = None,
) -> None:
    """Store log records as they arrive: each within --flush seconds, in batches, through the write gate.

    A record it cannot take (unreadable, too long, refused by the gate: a blocked source, a secret in block mode)
    is reported on stderr by its line number and skipped; the others are stored. End of input stores what was
    read and exits 0 (2 when every record was skipped); SIGTERM and SIGINT store what was read and exit 143, 130. `journalctl -f -o json | memctl ingest -f journal`,
    `memctl ingest app.log --follow --source app --cursor-file /var/lib/memctl/app.cursor`.
    """
    from memctl.ingest import stream

    request = stream.Request(
        file,
        fmt.value,
        source,
        kind,
        agent,
        flush,
        group.value,
        gap,
        follow,
        cursor_file,
        journal_unit,
        max_line,
    )
    opened = stream.open_input(request)
    st = settings()
    conn = connect()
    with interrupts.deferred():  # SIGINT, SIGTERM: what was read is stored, then exit 130, 143
        done = stream.run(
            conn,
            opened,
            warn=warn,
            should_stop=interrupts.requested,
            report=lambda n, why: warn(f"line {n}: {why}: skipped"),
        )
    counts = done.counts
    if done.redactor is not None and done.redactor.note():
        warn(done.redactor.note())
    warn(
        f"ingest: stored {counts.stored} ({counts.folded} folded as repeats), already stored {counts.already}, "
        f"skipped {counts.skipped}"
        + (f" ({counts.erased} erased before)" if counts.erased else "")
        + f", in {counts.batches} batches"
    )
    sys.stdout.flush()
    interrupts.check()
    if done.empty:
        raise jsonl.empty_stdin()
    if counts.skipped and not (counts.stored or counts.already):
        raise typer.Exit(done.first_skip)  # all skipped: a wrong --format, say (README: skip modes)
