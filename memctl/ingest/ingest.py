"""`memctl ingest`: a log stream into episodes as it arrives (docs/ingest.md).

Lines are read as they come (select on the input, never a read that waits past the flush deadline) and
gathered into a batch; every `flush` seconds, at end of input and on SIGINT or SIGTERM the batch is stored by
episodes.import_episodes: the gate, the repeats fold and the one COPY path of `episode import`, in one
transaction that also records where the stream stood (ingest_cursors, when a cursor file is named). A
restart reads that position from the database: after kill -9 too, the last committed batch is where it
resumes, with no record lost or stored twice; the cursor file is written after each commit for people and
for `journalctl --after-cursor`, and a record read again anyway is one already stored (memctl.write.identity).

Memory is bounded: a line is at most `max_line` bytes ([limits]: what a record within them takes, line_limit;
a longer one is reported and skipped, read to its end without keeping it), a batch at most BATCH records, a
group of lines at most [limits] episode_bytes. Each record passes the gate's checks with the same [limits]
(its size, a created_at between 1900 and clock_skew from now): one outside them is reported and skipped.
"""

from __future__ import annotations

import datetime
import itertools
import os
import select
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from memctl.errors import EXIT_USAGE, BadValue, Blocked, InvalidInput
from memctl.records import episodes
from memctl.ingest import logformats
from memctl.write import gate, identity, values

if TYPE_CHECKING:
    from memctl.db.memory import Memory

BATCH = 5000  # records a batch holds at most: stored at once when reached
MAX_LINE = 1 << 20
READ = 1 << 16
POLL = 0.2  # seconds between looks at a stop request or a followed file
LATE_BLOCKS = (
    5  # runs of a batch in a row that a source blocked meanwhile may refuse before the ingest fails
)
# A batch is stored once the input has been quiet this long, not only at its flush deadline: a line that
# comes alone (a trickle, the end of a burst) waits 0.1 s, not `flush`, while a stream that keeps coming
# is still stored in batches of `flush` seconds. A flush needs this much quiet after a read, so it costs
# at most 1 / IDLE transactions a second (a one-record batch: about 3 ms of this process and the server's).
IDLE = 0.1

GET_CURSOR = "SELECT position FROM ingest_cursors WHERE name = %s"
PUT_CURSOR = """
INSERT INTO ingest_cursors (name, position, updated_at) VALUES (%s, %s, now())
ON CONFLICT (name) DO UPDATE SET position = excluded.position, updated_at = excluded.updated_at
"""


SYSLOG_HEADER = (
    1024  # bytes a syslog line may have besides its message (priority, time, host, tag, data)
)


def line_limit(limits: values.Limits, fmt: str) -> int:
    """The longest line of FMT a record within [limits] can come from: its content (and a syslog header), or for
    JSON formats a record at the limits with every byte escaped (episode import's line_bytes)."""
    if fmt in ("jsonl", "journal"):
        return limits.line_bytes()
    return (
        limits.episode_bytes + 1 + (SYSLOG_HEADER if fmt == "syslog" else 0)
    )  # + 1: a CRLF line's \r


def stored_position(conn: Memory, name: str) -> str | None:
    row = conn.execute(GET_CURSOR, (name,)).fetchone()
    return None if row is None else row["position"]


@dataclass
class Line:
    number: int
    raw: bytes | None  # None: longer than max_line, skipped
    end: int  # byte offset after it


class LineReader:
    """Lines of a file descriptor as they arrive, each ending at its byte offset; `lines(timeout)` returns what
    came within the timeout ([] on none), None at the end of input (a followed file: never)."""

    def __init__(
        self, fd: int, *, offset: int = 0, max_line: int = MAX_LINE, follow: str | None = None
    ):
        self.fd, self.offset, self.max_line, self.follow = fd, offset, max_line, follow
        self.buffer = bytearray()
        self.number = 0
        self.last_read = time.monotonic()  # when bytes last came in
        self.empty = False  # the last look found nothing to read
        self.dropping = False  # inside a line past max_line: read to its newline, kept nowhere
        self.regular = os.path.isfile(f"/proc/self/fd/{fd}") if follow is None else True

    def lines(self, timeout: float) -> list[Line] | None:
        self.empty = True
        if not self.regular:
            ready, _, _ = select.select([self.fd], [], [], timeout)
            if not ready:
                return []
        data = os.read(self.fd, READ)
        if not data:
            if self.follow is None:
                return self._rest()
            time.sleep(min(timeout, POLL))
            self._reopen_if_rotated()
            return []
        self.empty, self.last_read = False, time.monotonic()
        return self._split(data)

    def quiet(self, seconds: float) -> bool:
        """Nothing came in for `seconds`, and the last look found nothing to read (not: busy elsewhere)."""
        return self.empty and time.monotonic() - self.last_read >= seconds

    def _rest(self) -> list[Line] | None:
        if self.buffer or self.dropping:
            start = self.offset - len(self.buffer)
            self.number += 1
            line = Line(self.number, None if self.dropping else bytes(self.buffer), self.offset)
            self.buffer.clear()
            self.dropping = False
            del start
            return [line]
        return None

    def _split(self, data: bytes) -> list[Line]:
        out: list[Line] = []
        self.offset += len(data)
        base = self.offset - len(data)  # data[i] sits at base + i
        start = 0
        while True:
            newline = data.find(b"\n", start)
            if newline < 0:
                break
            self.number += 1
            if self.dropping:
                out.append(Line(self.number, None, base + newline + 1))
                self.dropping = False
            else:
                piece = bytes(self.buffer) + data[start:newline]
                self.buffer.clear()
                out.append(
                    Line(
                        self.number,
                        piece if len(piece) <= self.max_line else None,
                        base + newline + 1,
                    )
                )
            start = newline + 1
        if not self.dropping:
            self.buffer += data[start:]
            if len(self.buffer) > self.max_line:
                self.buffer.clear()
                self.dropping = True
        return out

    def _reopen_if_rotated(self) -> None:
        """A followed file replaced (logrotate) or cut short: read the new one from its start."""
        assert self.follow is not None  # following a file
        try:
            now = os.stat(self.follow)
        except OSError:
            return
        mine = os.fstat(self.fd)
        if (now.st_ino, now.st_dev) != (mine.st_ino, mine.st_dev) or now.st_size < self.offset:
            fd = os.open(self.follow, os.O_RDONLY)
            os.close(self.fd)
            self.fd, self.offset, self.buffer, self.dropping = fd, 0, bytearray(), False


@dataclass
class Options:
    format: str = "lines"
    source: str | None = None
    kind: str | None = None
    agent: str | None = None
    flush: float = 1.0
    group: str = (
        "none"  # lines: none, blank (a blank line ends an episode), gap (a pause of `gap` s does)
    )
    gap: float = 2.0
    max_line: int = MAX_LINE
    bound: str = "--max-line"  # what sets max_line, named when a line is longer


@dataclass
class Counts:
    stored: int = 0
    folded: int = 0
    already: int = 0
    skipped: int = 0  # unreadable, too long, refused, erased
    erased: int = 0  # of them, records whose text the erasure ledger holds (memctl.write.erased)
    batches: int = 0


@dataclass
class _Pending:
    records: list[gate.NewEpisode] = field(default_factory=list)
    position: str | None = None  # where the stream stands after the last record taken
    group: list[str] = field(default_factory=list)
    group_bytes: int = 0
    group_end: int = 0
    last_line_at: float = 0.0


class Ingest:
    """Reads `reader`, stores batches on `conn`, reports a skipped line by calling `report(number, reason)`;
    once `should_stop()` says so (a signal: memctl.interrupts), stores what it read and returns."""

    def __init__(
        self,
        conn: Memory,
        reader: LineReader,
        options: Options,
        *,
        report: Callable[[int, str], None],
        cursor_name: str | None = None,
        after_commit: Callable[[str], None] | None = None,
        resume: str | None = None,
        should_stop: Callable[[], Any] = lambda: None,
    ):
        self.conn, self.settings, self.reader, self.options = conn, conn.settings, reader, options
        self.report, self.cursor_name, self.after_commit = report, cursor_name, after_commit
        self.should_stop = should_stop
        self.counts = Counts()
        self.first_skip = (
            0  # the exit code of the first record skipped (every record skipped: the command's)
        )
        self.limits = values.Limits.of(self.settings)  # read once, not per record
        self.pending = _Pending()
        self.group_first: int | None = None
        self.occurrences = identity.Occurrences()  # stays empty: every ingested record has a time
        self.result = episodes.ImportResult()
        self.resume = (
            logformats.journal_position(resume) if resume and options.format == "journal" else None
        )

    def run(self) -> Counts:
        """Until the end of input or stop(): a batch is stored `flush` seconds after its first record at the
        latest, sooner when the input has been quiet for IDLE seconds (nothing more is coming for now) or
        BATCH records are waiting."""
        deadline = None
        while True:
            wait = POLL
            if deadline is not None:
                quiet_at = self.reader.last_read + IDLE
                wait = max(0.0, min(POLL, deadline - time.monotonic(), quiet_at - time.monotonic()))
            lines = self.reader.lines(wait)
            if lines is None:
                self._close_group()
                self.flush()
                return self.counts
            for line in lines:
                self._take(line)
            now = time.monotonic()
            if (
                self.pending.group
                and self.options.group == "gap"
                and now - self.pending.last_line_at >= self.options.gap
            ):
                self._close_group()
            if self.pending.records and deadline is None:
                deadline = now + self.options.flush
            stopping = bool(self.should_stop())
            if (
                stopping
                or len(self.pending.records) >= BATCH
                or (deadline is not None and (now >= deadline or self.reader.quiet(IDLE)))
            ):
                if stopping:
                    self._close_group()
                self.flush()
                deadline = None
                if stopping:
                    return self.counts

    # reading

    def _take(self, line: Line) -> None:
        if line.raw is None:
            self._skip(
                line.number,
                f"longer than {self.options.max_line:,} bytes ({self.options.bound})",
                EXIT_USAGE,
            )
            return
        raw = line.raw[:-1] if line.raw.endswith(b"\r") else line.raw
        try:
            record = self._parse(raw, line)
        except (InvalidInput, BadValue) as exc:
            self._skip(line.number, str(exc), exc.exit_code)
            return
        if record is None:
            if not self.pending.group:
                self.pending.position = str(line.end)
            return
        self._add(record, line.number, str(line.end) if record.cursor is None else record.cursor)

    def _parse(self, raw: bytes, line: Line) -> logformats.Record | None:
        fmt = self.options.format
        now = datetime.datetime.now(datetime.timezone.utc)
        if fmt == "lines":
            content = logformats.text(raw)
            self._group_line(content, line)
            return None
        if fmt == "jsonl":
            record = logformats.jsonl_record(raw, episodes.FIELDS)
        elif fmt == "journal":
            record = logformats.journal(raw)
            if self.resume is not None and record.cursor is not None:
                at = logformats.journal_position(record.cursor)
                if at is not None and at[0] == self.resume[0] and at[1] <= self.resume[1]:
                    return None  # stored before the restart
        else:
            record = logformats.syslog(raw, now)
        if record is not None and record.created_at is None:
            record.created_at = now
        return record

    def _group_line(self, content: str, line: Line) -> None:
        pending, opts = self.pending, self.options
        if opts.group == "none":
            if content.strip():
                self._add(logformats.Record(content), line.number, str(line.end))
            else:
                pending.position = str(line.end)
            return
        if opts.group == "blank" and not content.strip():
            self._close_group()
            pending.position = str(line.end)
            return
        size = len(content.encode("utf-8", "surrogatepass")) + 1
        if pending.group and pending.group_bytes + size > self.limits.episode_bytes + 1:
            self._close_group()  # the next line would take the group past [limits] episode_bytes
        pending.group.append(content)
        pending.group_bytes += size
        pending.group_end, pending.last_line_at = line.end, time.monotonic()
        self.group_first = self.group_first or line.number

    def _close_group(self) -> None:
        pending = self.pending
        if not pending.group:
            return
        content = "\n".join(pending.group)
        pending.group, pending.group_bytes = [], 0
        number, self.group_first = self.group_first, None
        assert number is not None  # set by the group's first line
        if content.strip():
            self._add(logformats.Record(content), number, str(pending.group_end))
        else:
            pending.position = str(pending.group_end)

    def _add(self, record: logformats.Record, number: int, position: str) -> None:
        opts = self.options
        try:
            episode = gate.validate(
                self.settings,
                record.content,
                kind=record.kind or opts.kind or logformats.LOG_KIND,
                source=record.source or opts.source,
                agent=record.agent or opts.agent,
                importance=record.importance,
                created_at=record.created_at or datetime.datetime.now(datetime.timezone.utc),
                meta=record.meta,
                limits=self.limits,
            )
        except (InvalidInput, BadValue) as exc:
            self._skip(number, str(exc), exc.exit_code)
            return
        episode.line = number
        self.pending.records.append(episode)
        self.pending.position = position

    def _skip(self, number: int, reason: str, code: int) -> None:
        self.counts.skipped += 1
        self.first_skip = self.first_skip or code
        self.report(number, reason)

    # writing

    def flush(self) -> None:
        """Store the batch and, in its transaction, where the stream stands after it."""
        pending = self.pending
        position = pending.position
        if not pending.records and (position is None or self.cursor_name is None):
            return
        records, pending.records = pending.records, []

        def then(conn: Memory) -> None:
            if self.cursor_name is not None and position is not None:
                conn.execute(PUT_CURSOR, (self.cursor_name, position))

        result, refusals = self._store(records, then)
        for number, reason, code in refusals:
            self._skip(number, reason, code)
        self.result.redactor = result.redactor
        self.counts.stored += result.imported
        self.counts.folded += result.folded
        self.counts.already += result.already
        self.counts.erased += result.erased
        self.counts.skipped += result.erased
        self.counts.batches += 1
        if position is not None and self.after_commit is not None and self.cursor_name is not None:
            self.after_commit(position)

    def _store(
        self, records: list[gate.NewEpisode], then
    ) -> tuple[episodes.ImportResult, list[tuple[int, str, int]]]:
        """The batch in one transaction, each record the gate refuses (a blocked source, a secret in block mode)
        left out and returned with its reason. A source blocked while the transaction ran refuses it whole
        (memctl.write.gate): it is run again, where the gate refuses that source's records alone."""
        for attempt in itertools.count(1):
            refusals: list[tuple[int, str, int]] = []
            redactor = self.result.redactor
            counted = None if redactor is None else redactor.kinds.copy()
            result = episodes.ImportResult(redactor=redactor)
            try:
                episodes.import_episodes(
                    self.conn,
                    iter(records),
                    result=result,
                    occurrences=self.occurrences,
                    then=then,
                    refused=lambda episode, exc: refusals.append(
                        (episode.line or 0, str(exc), exc.exit_code)
                    ),
                )
                return result, refusals
            except Blocked:
                if attempt >= LATE_BLOCKS:
                    raise
                if redactor is not None and counted is not None:
                    redactor.kinds = counted  # counted again by the run that stores
        raise AssertionError(
            "unreachable: itertools.count does not end"
        )  # for the checker: the loop returns
