"""memctl ingest: a log stream into episodes as it arrives (docs/ingest.md)."""

from __future__ import annotations

import os
import sys
from enum import Enum
from typing import Annotated, Optional

import typer

from memctl import interrupts

from memctl.files import jsonl
from memctl.cli.common import connect, settings, warn
from memctl.errors import BadValue


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
    fmt: Annotated[LogFormat, typer.Option(
        "--format", "-f", help="lines (one episode a line), jsonl (episode import's), journal (journalctl -o json), "
                               "syslog (RFC 5424 / 3164).")] = LogFormat.lines,
    source: Annotated[Optional[str], typer.Option(
        "--source", "-s", help="Source of records that name none (lines: every record).")] = None,
    kind: Annotated[Optional[str], typer.Option("--kind", help="Kind of records that name none (default log).")] = None,
    agent: Annotated[Optional[str], typer.Option("--agent", "-a", help="Agent of records that name none.")] = None,
    flush: Annotated[float, typer.Option(
        "--flush", min=0.05, max=3600,
        help="Seconds a record waits at most before its batch is stored (sooner once the input is quiet "
             "for 0.1 s).")] = 1.0,
    group: Annotated[Group, typer.Option(
        "--group", help="lines: one episode a line (none), lines up to a blank line (blank), or lines up to a "
                        "pause of --gap seconds (gap).")] = Group.none,
    gap: Annotated[float, typer.Option("--gap", min=0.01, max=3600, help="Seconds of quiet that end a group.")] = 2.0,
    follow: Annotated[bool, typer.Option(
        "--follow", help="FILE: keep reading as it grows, and from the start of a new file when it is rotated.")] = False,
    cursor_file: Annotated[Optional[str], typer.Option(
        "--cursor-file", help="Resume where the last stored batch ended: a byte offset in FILE, or journald's "
                              "__CURSOR (--format journal). Kept in the database with each batch; written here "
                              "after each commit.")] = None,
    journal_unit: Annotated[Optional[str], typer.Option(
        "--journal-unit", help="Follow this systemd unit's journal (runs journalctl -f -o json; implies --format "
                               "journal; with --cursor-file it resumes after the last stored entry, else starts "
                               "at the journal's end).")] = None,
    max_line: Annotated[Optional[int], typer.Option(
        "--max-line", min=1024, max=64 << 20, help="Bytes a line may have; a longer one is reported and skipped "
                                                   "(default: what a record within \\[limits] takes).")] = None,
) -> None:
    """Store log records as they arrive: each within --flush seconds, in batches, through the write gate.

    A record it cannot take (unreadable, too long, refused by the gate: a blocked source, a secret in block mode)
    is reported on stderr by its line number and skipped; the others are stored. End of input stores what was
    read and exits 0 (2 when every record was skipped); SIGTERM and SIGINT store what was read and exit 143, 130. `journalctl -f -o json | memctl ingest -f journal`,
    `memctl ingest app.log --follow --source app --cursor-file /var/lib/memctl/app.cursor`.
    """
    from memctl import files
    from memctl.ingest import ingest as ingest_mod
    from memctl.write import values

    if file == "-" and follow:
        raise BadValue("--follow: needs a FILE (stdin is followed as long as it is open)", "--follow")
    if journal_unit is not None:
        if file != "-":
            raise BadValue("--journal-unit: reads the journal, not a FILE as well", "--journal-unit")
        fmt = LogFormat.journal
    fd = 0 if file == "-" or journal_unit is not None else _open(file)
    seekable = os.path.isfile(f"/proc/self/fd/{fd}")
    if cursor_file is not None and fmt != LogFormat.journal and not seekable:
        raise BadValue("--cursor-file: a byte offset resumes a FILE (or stdin redirected from one), not a pipe; "
                       "journald's cursor needs --format journal", "--cursor-file")
    st = settings()
    conn = connect()
    name = os.path.abspath(cursor_file) if cursor_file is not None else None
    resume = ingest_mod.stored_position(conn, name) if name is not None else None
    child = None
    if journal_unit is not None:
        child = _journalctl(journal_unit, resume)
        fd = child.stdout.fileno()
    offset = 0
    if resume is not None and fmt != LogFormat.journal:
        offset = int(resume) if resume.isdigit() else 0
        if offset > os.fstat(fd).st_size:
            warn(f"{cursor_file}: the stored offset {offset} is past the file's end: reading it from the start")
            offset = 0
        os.lseek(fd, offset, os.SEEK_SET)
    bound = "--max-line"
    if max_line is None:
        max_line, bound = ingest_mod.line_limit(values.Limits.of(st), fmt.value), "what a record within [limits] takes"
    reader = ingest_mod.LineReader(fd, offset=offset, max_line=max_line,
                                   follow=os.path.abspath(file) if follow else None)

    def after_commit(position: str) -> None:
        files.write_text(cursor_file, position + "\n")

    options = ingest_mod.Options(fmt.value, source, kind, agent, flush, group.value, gap, max_line, bound)
    run = ingest_mod.Ingest(conn, st, reader, options, report=lambda n, why: warn(f"line {n}: {why}: skipped"),
                            cursor_name=name, after_commit=after_commit, resume=resume,
                            should_stop=interrupts.requested)
    try:
        with interrupts.deferred():  # SIGINT, SIGTERM: what was read is stored, then exit 130, 143
            counts = run.run()
    finally:
        if child is not None:
            child.terminate()
            child.wait(30)
    if run.result.redactor is not None and run.result.redactor.note():
        warn(run.result.redactor.note())
    warn(f"ingest: stored {counts.stored} ({counts.folded} folded as repeats), already stored {counts.already}, "
         f"skipped {counts.skipped}" + (f" ({counts.erased} erased before)" if counts.erased else "")
         + f", in {counts.batches} batches")
    sys.stdout.flush()
    interrupts.check()
    if fd == 0 and reader.offset == 0:
        raise jsonl.empty_stdin()
    if counts.skipped and not (counts.stored or counts.already):
        raise typer.Exit(run.first_skip)  # every record skipped: a wrong --format, say (README: skip modes)


def _journalctl(unit: str, cursor: str | None):
    import shutil
    import subprocess

    from memctl.errors import Unavailable

    exe = shutil.which("journalctl")
    if exe is None:
        raise Unavailable("--journal-unit: journalctl is not installed")
    start = [f"--after-cursor={cursor}"] if cursor else ["--lines=0"]
    return subprocess.Popen([exe, "--follow", "--output=json", f"--unit={unit}", *start], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE)


def _open(path: str) -> int:
    import stat

    from memctl.errors import InvalidInput

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}") from None
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        raise BadValue(f"{path} is a directory: ingest reads a log file (or stdin)", "FILE")
    return fd
