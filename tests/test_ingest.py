"""memctl ingest: log streams stored as they arrive, resumable, idempotent (docs/ingest.md)."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import time
from pathlib import Path

from memctl.ingest import logformats
from tests import steps
from tests.installed import memctl_exe, start_ingest

NOW = datetime.datetime(2026, 12, 5, 14, 0, tzinfo=datetime.timezone.utc)


def count(conn, where: str = "true") -> int:
    return conn.execute(f"SELECT count(*) AS n FROM episodes WHERE {where}").fetchone()["n"]  # noqa: S608


def wait_for(check, seconds: float = 30) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.1)
    return False


def test_lines_written_slowly_into_a_pipe_are_found_while_it_is_open(memctl_env, memctl_bin):
    proc = start_ingest(memctl_env, "--format", "lines", "--source", "app", "--flush", "0.5")
    try:
        for word in ("zanzibar", "quokka"):
            proc.stdin.write(f"payment gateway {word} timed out\n".encode())
            proc.stdin.flush()
            assert wait_for(
                lambda: word in memctl_bin("episode", "search", word, "--mode", "text").stdout
            )
        assert proc.poll() is None  # still reading
    finally:
        proc.stdin.close()
    proc.wait(60)
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    assert b"stored 2" in err


def test_journal_json_keeps_time_unit_priority_and_a_byte_array_message(memctl_env, conn):
    entries = [
        {
            "__CURSOR": "s=ab;i=1",
            "__REALTIME_TIMESTAMP": "1733400000123456",
            "PRIORITY": "3",
            "_SYSTEMD_UNIT": "nginx.service",
            "MESSAGE": "upstream timed out",
            "_HOSTNAME": "vps",
        },
        {
            "__CURSOR": "s=ab;i=2",
            "__REALTIME_TIMESTAMP": "1733400001000000",
            "SYSLOG_IDENTIFIER": "cron",
            "MESSAGE": list(b"caf\xc3\xa9 \xff"),
        },
        "not json",
        {"__CURSOR": "s=ab;i=3", "__REALTIME_TIMESTAMP": "1733400002000000"},
    ]
    data = "".join((e if isinstance(e, str) else json.dumps(e)) + "\n" for e in entries).encode()
    proc = start_ingest(memctl_env, "--format", "journal")
    _, err = proc.communicate(data, timeout=60)
    assert proc.returncode == 0, err
    assert b"line 3: not valid JSON" in err and b"line 4: no MESSAGE" in err
    rows = conn.execute(
        "SELECT source, created_at, importance, kind, content, meta FROM episodes ORDER BY id"
    ).fetchall()
    assert (
        rows[0]["source"] == "nginx.service"
        and rows[0]["importance"] == 7
        and rows[0]["kind"] == "log"
    )
    assert rows[0]["created_at"] == datetime.datetime(
        2024, 12, 5, 12, 0, 0, 123456, tzinfo=datetime.timezone.utc
    )
    assert rows[0]["meta"] == {"host": "vps", "priority": "err"}
    assert (
        rows[1]["source"] == "cron" and rows[1]["content"] == "caf\u00e9 \ufffd" and len(rows) == 2
    )


def test_a_file_resumes_at_its_cursor_with_nothing_lost_or_twice(memctl_env, conn, tmp_path):
    log, cursor = tmp_path / "app.log", tmp_path / "app.cursor"
    log.write_text("one\ntwo\n")
    for expected in (2, 4):
        proc = start_ingest(memctl_env, str(log), "--source", "app", "--cursor-file", str(cursor))
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert count(conn) == expected
        assert cursor.read_text().strip() == str(log.stat().st_size)
        with log.open("a") as f:
            f.write("three\nfour\n")
    # the database holds the position: a cursor file lost with a kill -9 after the commit changes nothing
    cursor.unlink()
    proc = start_ingest(memctl_env, str(log), "--source", "app", "--cursor-file", str(cursor))
    proc.communicate(timeout=60)
    assert [r["content"] for r in conn.execute("SELECT content FROM episodes ORDER BY id")] == [
        "one",
        "two",
        "three",
        "four",
        "three",
        "four",
    ]


def test_a_line_that_comes_alone_is_stored_long_before_its_flush_deadline(memctl_env, conn):
    # --flush is the longest a record waits: once the input goes quiet, what was read is stored
    proc = start_ingest(memctl_env, "--source", "app", "--flush", "3600")
    try:
        for n in (1, 2):
            proc.stdin.write(f"line {n} of a quiet log\n".encode())
            proc.stdin.flush()
            assert wait_for(lambda: count(conn) == n)
        assert proc.poll() is None  # still reading
    finally:
        proc.stdin.close()
    proc.wait(60)
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    assert b"stored 2" in err and b"in 2 batches" in err


def test_a_line_too_long_or_unreadable_is_reported_and_the_stream_goes_on(memctl_env, conn):
    data = b"short\n" + b"x" * 5000 + b"\n\xff\xfe\nafter\n"
    proc = start_ingest(memctl_env, "--source", "app", "--max-line", "1024")
    _, err = proc.communicate(data, timeout=60)
    assert proc.returncode == 0, err
    assert b"line 2: longer than 1,024 bytes" in err and b"line 3: not valid UTF-8" in err
    assert [r["content"] for r in conn.execute("SELECT content FROM episodes ORDER BY id")] == [
        "short",
        "after",
    ]


def test_limits_bound_lines_groups_and_times_and_the_stream_goes_on(memctl_env, conn):
    """[limits] as every other write path: a line longer than a record within them is reported naming [limits]
    and skipped (read to its end, not held), a group closes before it outgrows episode_bytes, and a created_at
    before 1900 or past clock_skew is reported and skipped."""
    Path(memctl_env["MEMCTL_CONFIG"]).write_text("[limits]\nepisode_bytes = 131072\n")
    big = b"y" * 200_000
    proc = start_ingest(memctl_env, "--source", "app")
    _, err = proc.communicate(b"first\n" + big + b"\nlast\n", timeout=60)
    assert proc.returncode == 0, err
    assert b"line 2: longer than 131,073 bytes" in err and b"[limits]" in err
    assert [r["content"] for r in conn.execute("SELECT content FROM episodes ORDER BY id")] == [
        "first",
        "last",
    ]

    block = ("z" * 50_000 + "\n").encode() * 4  # 200 KB of lines in one group
    proc = start_ingest(memctl_env, "--source", "grouped", "--group", "blank")
    _, err = proc.communicate(block, timeout=60)
    assert proc.returncode == 0, err
    sizes = [
        r["n"]
        for r in conn.execute(
            "SELECT octet_length(content) AS n FROM episodes WHERE source = 'grouped' ORDER BY id"
        )
    ]
    assert sum(sizes) == 4 * 50_000 + 2 and len(sizes) == 2 and max(sizes) <= 131072

    far = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=3)
    rows = [
        {"content": "too early", "created_at": "1850-01-01T00:00:00Z"},
        {"content": "ahead", "created_at": far.isoformat()},
        {"content": "on time", "created_at": "2026-01-01T00:00:00Z"},
    ]
    proc = start_ingest(memctl_env, "--format", "jsonl", "--source", "timed")
    _, err = proc.communicate("".join(json.dumps(r) + "\n" for r in rows).encode(), timeout=60)
    assert proc.returncode == 0, err
    assert b"line 1: " in err and b"1900" in err and b"line 2: " in err and b"clock_skew" in err
    assert [
        r["content"] for r in conn.execute("SELECT content FROM episodes WHERE source = 'timed'")
    ] == ["on time"]


def test_lines_grouped_by_a_blank_line(memctl_env, conn):
    proc = start_ingest(memctl_env, "--source", "app", "--group", "blank")
    proc.communicate(b"Traceback:\n  File x\n\nnext one\n", timeout=60)
    assert [r["content"] for r in conn.execute("SELECT content FROM episodes ORDER BY id")] == [
        "Traceback:\n  File x",
        "next one",
    ]


def test_ingesting_the_same_journal_twice_stores_it_once(memctl_env, conn):
    data = "".join(
        json.dumps(
            {
                "__CURSOR": f"s=ab;i={i:x}",
                "__REALTIME_TIMESTAMP": str(1733400000000000 + i),
                "_SYSTEMD_UNIT": "a.service",
                "MESSAGE": "tick",
            }
        )
        + "\n"
        for i in range(5)
    ).encode()
    for _ in range(2):
        proc = start_ingest(memctl_env, "--format", "journal")
        proc.communicate(data, timeout=60)
        assert proc.returncode == 0
    assert count(conn) == 5


def test_syslog_formats():
    five = logformats.syslog(
        b'<165>1 2003-10-11T22:14:15.003Z host app - ID47 [x a="q\\]z"][y] the msg', NOW
    )
    assert (five.source, five.importance, five.content, five.meta) == (
        "app",
        4,
        "the msg",
        {"host": "host", "priority": "notice"},
    )
    assert five.created_at == datetime.datetime(
        2003, 10, 11, 22, 14, 15, 3000, tzinfo=datetime.timezone.utc
    )
    bsd = logformats.syslog(b"<34>Oct 11 22:14:15 mymachine su[7]: 'su root' failed", NOW)
    assert (bsd.source, bsd.importance, bsd.content, bsd.created_at.year) == (
        "su",
        8,
        "'su root' failed",
        2026,
    )
    december = logformats.syslog(
        b"Dec 31 23:59:59 h cron: x",
        datetime.datetime(2027, 1, 1, 0, 5, tzinfo=datetime.timezone.utc),
    )
    assert december.created_at.year == 2026  # last year's line read in January
    rsyslog = logformats.syslog(b"2026-12-05T14:12:17.5+01:00 vps systemd[1]: Started x.", NOW)
    assert (rsyslog.source, rsyslog.content) == ("systemd", "Started x.")


def test_syslog_keeps_the_pid_in_meta_and_reports_a_line_that_is_not_syslog(memctl_env, conn):
    """docs/ingest.md: host, pid and severity name go to meta; a line neither <PRI> nor a time starts is no syslog
    line: reported by its number and skipped, never stored as written now with no source."""
    assert logformats.syslog(b"<34>Oct 11 22:14:15 vps sshd[4711]: Accepted key", NOW).meta == {
        "host": "vps",
        "pid": "4711",
        "priority": "crit",
    }
    assert (
        logformats.syslog(b"<165>1 2003-10-11T22:14:15Z h app 99 - - msg", NOW).meta["pid"] == "99"
    )
    data = b"<34>Oct 11 22:14:15 vps sshd[4711]: Accepted key\nTraceback (most recent call last):\n"
    proc = start_ingest(memctl_env, "--format", "syslog")
    _, err = proc.communicate(data, timeout=60)
    assert proc.returncode == 0, err
    assert b"line 2: not a syslog line" in err and b"skipped 1" in err
    rows = conn.execute("SELECT source, meta FROM episodes").fetchall()
    assert rows == [{"source": "sshd", "meta": {"host": "vps", "pid": "4711", "priority": "crit"}}]


def test_syslog_parser_is_linear_on_hostile_input():
    """An unclosed structured-data element of backslashes: refused, in steps linear in its length (tests/steps.py:
    a parser that looks back over the escapes before each character takes ~100 times the steps at 10 times n)."""

    def line(n: int) -> bytes:
        return b'<1>1 - - - - - [a x="' + b"\\" * n

    for refused in steps.linear(lambda raw: logformats.syslog(raw, NOW), line, 2_000):
        assert isinstance(refused, logformats.BadLine) and "closing ]" in str(refused), refused


# --- the shell's rough edges (issue 40) ---------------------------------------------------------------------


def test_a_reader_that_goes_away_is_a_quiet_exit_0(memctl_env, cli):
    rows = "".join(
        json.dumps({"content": f"episode number {i} " + "x" * 200}) + "\n" for i in range(3000)
    )
    assert cli("episode", "import", "-", input=rows).exit_code == 0
    proc = subprocess.Popen(
        [memctl_exe(), "episode", "list", "-n", "3000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **memctl_env},
    )
    assert proc.stdout.readline()
    proc.stdout.close()  # `| head -1`
    proc.wait(60)
    assert proc.returncode == 0 and proc.stderr.read() == b""


def test_an_unknown_job_and_a_reversed_period_exit_2(cli):
    out = cli("jobs", "--job", "nonsense")
    assert (
        out.exit_code == 2
        and "nonsense" in out.stderr
        and "backup" in out.stderr
        and "restore" in out.stderr
    )
    assert cli("jobs", "--job", "backup").exit_code == 0
    help_text = " ".join(cli("jobs", "--help").stdout.split())
    for job in ("embed", "summarize", "prune", "purge", "reembed", "backup", "restore"):
        assert job in help_text
    out = cli("episode", "search", "disk", "--mode", "text", "--since", "1d", "--until", "7d")
    assert out.exit_code == 2 and "--since" in out.stderr and "empty" in out.stderr
    assert (
        cli(
            "episode", "search", "disk", "--mode", "text", "--since", "7d", "--until", "1d"
        ).exit_code
        == 0
    )


def test_a_full_disk_under_the_shells_redirect_is_not_called_untouched(memctl_env, cli, full_disk):
    """`memctl episode list > /full/out`: the file the shell created is cut short, and the message says so
    instead of "nothing was half written"."""
    rows = "".join(json.dumps({"content": f"episode {i} " + "y" * 300}) + "\n" for i in range(3000))
    assert cli("episode", "import", "-", input=rows).exit_code == 0
    full_disk.fill()
    with open(full_disk.path / "out", "wb") as out:
        done = subprocess.run(
            [memctl_exe(), "episode", "list", "-n", "3000", "-f", "jsonl"],
            stdout=out,
            stderr=subprocess.PIPE,
            env={**os.environ, **memctl_env},
        )
    assert done.returncode == 5, done.stderr
    assert b"cut short" in done.stderr and b"nothing was half written" not in done.stderr
