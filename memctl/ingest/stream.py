"""What `memctl ingest` reads, and the run over it: a log FILE (followed as it grows and is
rotated), stdin, or a systemd unit's journal (journalctl -f), resumed after the last stored batch
(docs/ingest.md).

`open_input` checks the options and opens the input before any connection; `run` reads the stored
position, starts journalctl, seeks, and runs memctl.ingest.ingest.Ingest until the end of input or
a stop request, writing the cursor file after each commit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from memctl.errors import BadValue
from memctl.ingest import ingest
from memctl.write import values

if TYPE_CHECKING:
    from memctl.db.memory import Memory


@dataclass
class Request:
    """`memctl ingest`'s options: where to read (file: '-' for stdin), how, and the defaults of the
    records that name none."""

    file: str = "-"
    format: str = "lines"
    source: str | None = None
    kind: str | None = None
    agent: str | None = None
    flush: float = 1.0
    group: str = "none"
    gap: float = 2.0
    follow: bool = False
    cursor_file: str | None = None
    journal_unit: str | None = None
    max_line: int | None = None  # None: what a record within [limits] takes (ingest.line_limit)


@dataclass
class Input:
    """An opened input: its descriptor (stdin's 0 until a journal replaces it) and the request,
    its format `journal` when it reads a unit's journal."""

    fd: int
    request: Request


@dataclass
class Outcome:
    counts: ingest.Counts
    redactor: Any  # the redactor of the last batch stored (memctl.redact.Redactor), or None
    first_skip: int  # the exit code of the first record skipped (all skipped: the command's)
    empty: bool  # stdin gave nothing at all


def open_input(request: Request) -> Input:
    """The request checked (BadValue naming the option) and its FILE opened; stdin or the journal
    otherwise (the journal is started by run(), which knows where the last batch ended)."""
    if request.file == "-" and request.follow:
        raise BadValue(
            "--follow: needs a FILE (stdin is followed as long as it is open)", "--follow"
        )
    if request.journal_unit is not None:
        if request.file != "-":
            raise BadValue(
                "--journal-unit: reads the journal, not a FILE as well", "--journal-unit"
            )
        request.format = "journal"
    fd = 0 if request.file == "-" or request.journal_unit is not None else _open(request.file)
    seekable = os.path.isfile(f"/proc/self/fd/{fd}")
    if request.cursor_file is not None and request.format != "journal" and not seekable:
        raise BadValue(
            "--cursor-file: a byte offset resumes a FILE (or stdin redirected from "
            "one), not a pipe; journald's cursor needs --format journal",
            "--cursor-file",
        )
    return Input(fd, request)


def run(
    conn: Memory,
    source: Input,
    *,
    report: Callable[[int, str], None],
    warn: Callable[[str], None],
    should_stop: Callable[[], Any] = lambda: None,
) -> Outcome:
    """Ingest SOURCE until the end of input or `should_stop()`; `report(number, reason)` for a
    record skipped, `warn(message)` for the rest of what a person should hear."""
    settings = conn.settings
    from memctl import files

    request, fd = source.request, source.fd
    cursor_file = request.cursor_file
    name = os.path.abspath(cursor_file) if cursor_file is not None else None
    resume = ingest.stored_position(conn, name) if name is not None else None
    child = None
    if request.journal_unit is not None:
        child = _journalctl(request.journal_unit, resume)
        fd = child.stdout.fileno()
    offset = 0
    if resume is not None and request.format != "journal":
        offset = int(resume) if resume.isdigit() else 0
        if offset > os.fstat(fd).st_size:
            warn(
                f"{cursor_file}: the stored offset {offset} is past the file's end: reading it "
                "from the start"
            )
            offset = 0
        os.lseek(fd, offset, os.SEEK_SET)
    max_line, bound = request.max_line, "--max-line"
    if max_line is None:
        max_line = ingest.line_limit(values.Limits.of(settings), request.format)
        bound = "what a record within [limits] takes"
    reader = ingest.LineReader(
        fd,
        offset=offset,
        max_line=max_line,
        follow=os.path.abspath(request.file) if request.follow else None,
    )

    def after_commit(position: str) -> None:
        assert cursor_file is not None  # given to the ingest only with one
        files.write_text(cursor_file, position + "\n")

    options = ingest.Options(
        request.format,
        request.source,
        request.kind,
        request.agent,
        request.flush,
        request.group,
        request.gap,
        max_line,
        bound,
    )
    running = ingest.Ingest(
        conn,
        reader,
        options,
        report=report,
        cursor_name=name,
        after_commit=after_commit,
        resume=resume,
        should_stop=should_stop,
    )
    try:
        counts = running.run()
    finally:
        if child is not None:
            child.terminate()
            child.wait(30)
    return Outcome(
        counts, running.result.redactor, running.first_skip, fd == 0 and reader.offset == 0
    )


def _journalctl(unit: str, cursor: str | None):
    import shutil
    import subprocess

    from memctl.errors import Unavailable

    exe = shutil.which("journalctl")
    if exe is None:
        raise Unavailable("--journal-unit: journalctl is not installed")
    start = [f"--after-cursor={cursor}"] if cursor else ["--lines=0"]
    return subprocess.Popen(
        [exe, "--follow", "--output=json", f"--unit={unit}", *start],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
    )


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
