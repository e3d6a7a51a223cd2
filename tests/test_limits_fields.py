"""Issue 37: one size limit for every write, every field through the same redaction, safe --out files, sane times."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from memctl import files, redact
from memctl.errors import BadValue
from memctl.write import gate
from memctl.write.values import WRITER

# Built at run time, so no scanner mistakes this file for a leak.
GITHUB = "ghp_" + "aBcD1234EfGh5678IjKl" + "9012MnOp3456QrSt"
URL_PW = "S3cret" + "Pw99"
FEED = f"https://user:{URL_PW}@feeds.example.com/rss"
SMALL = 128 * 1024  # the least [limits] episode_bytes takes


def limits(memctl_env, **values) -> None:
    body = "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())
    Path(memctl_env["MEMCTL_CONFIG"]).write_text("[limits]\n" + body)


def count(conn, table: str) -> int:
    return conn.execute(f"SELECT count(*) AS n FROM {table}").fetchone()["n"]  # noqa: S608 - a test's own name


# ------------------------------------------------------------ one size limit


def test_an_episode_over_the_limit_is_refused_on_every_cli_path_naming_it(
    cli, conn, memctl_env, tmp_path
):
    limits(memctl_env, episode_bytes=SMALL)
    big = "x" * (SMALL + 1)
    for args, data in (
        (("episode", "add", big), None),
        (("episode", "add", "-"), big),
        (("episode", "import", "-"), json.dumps({"content": big}) + "\n"),
    ):
        out = cli(*args, input=data)
        assert out.exit_code == 2 and "[limits] episode_bytes" in out.stderr, (args, out.stderr)
    exported = cli("export").stdout.splitlines()[0]
    record = {
        "type": "episode",
        "id": 1,
        "agent": "a",
        "content": big,
        "created_at": "2026-08-01T00:00:00Z",
    }
    out = cli("import", "-", input=exported + "\n" + json.dumps(record) + "\n")
    assert out.exit_code == 2 and "line 2" in out.stderr and "episode_bytes" in out.stderr
    meta = cli("episode", "add", "small", "--meta", json.dumps({"blob": "y" * 70_000}))
    assert meta.exit_code == 2 and "[limits] meta_bytes" in meta.stderr
    assert count(conn, "episodes") == 0 and count(conn, "chunks") == 0
    exactly = cli("episode", "add", "-", input="z" * SMALL)  # at the limit is in
    assert exactly.exit_code == 0, exactly.stderr


def test_a_fact_value_over_the_limit_is_refused_by_set_and_import(cli, conn, memctl_env):
    limits(memctl_env, value_bytes=1000)
    for args, data in (
        (("fact", "set", "k", "v" * 1001), None),
        (("fact", "set", "k", "-"), "v" * 1001),
        (("fact", "import", "-"), json.dumps({"key": "k", "value": "v" * 1001}) + "\n"),
    ):
        out = cli(*args, input=data)
        assert out.exit_code == 2 and "[limits] value_bytes" in out.stderr, (args, out.stderr)
        assert len(out.stdout) < 1000  # nothing echoed back
    assert count(conn, "facts") == 0 and count(conn, "fact_history") == 0


def read_from_file(run, data: bytes, tmp_path: Path):
    """run(stdin=file) with data in a regular file: (its outcome, how many bytes of data the process read). The
    process shares the file's offset, so where the offset stands after it exits is how far it read."""
    path = tmp_path / "stdin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        out = run(stdin=fd)
        return out, os.lseek(fd, 0, os.SEEK_CUR)
    finally:
        os.close(fd)


READ_AHEAD = 64 * 1024  # what a buffered reader may take past the bytes it was asked for


def test_stdin_past_the_limit_is_refused_without_reading_it_all(
    memctl_bin, memctl_env, conn, tmp_path
):
    """10 MB on stdin: refused at the default 1 MiB with exit 2, nothing queued (it queued 15,763 chunks), and the
    process read no more than the limit allows (plus a read-ahead): the rest of the 10 MB stayed unread."""
    data = b"token: " * (10 * 1024 * 1024 // 7)
    out, read = read_from_file(lambda **k: memctl_bin("episode", "add", "-", **k), data, tmp_path)
    assert out.exit_code == 2 and "1,048,576" in out.stderr and "episode_bytes" in out.stderr
    assert 1024 * 1024 < read <= 1024 * 1024 + 3 + READ_AHEAD, (
        f"read {read:,} of {len(data):,} bytes"
    )
    out, read = read_from_file(
        lambda **k: memctl_bin("fact", "set", "k", "-", **k), b"v" * (10 * 1024 * 1024), tmp_path
    )
    assert out.exit_code == 2 and "value_bytes" in out.stderr and len(out.stdout) == 0
    assert 64 * 1024 < read <= 64 * 1024 + 3 + READ_AHEAD, f"read {read:,} bytes"
    assert (
        count(conn, "episodes") == 0
        and count(conn, "embed_queue") == 0
        and count(conn, "facts") == 0
    )


def test_an_endless_jsonl_line_is_refused_at_its_bound(memctl_bin, conn, memctl_env, tmp_path):
    """A line longer than any record within the limits (values.Limits.line_bytes) is refused when the reader has
    read that far into it: the bytes after stay unread."""
    limits(memctl_env, episode_bytes=SMALL, meta_bytes=1024, value_bytes=1024)
    bound = 6 * (SMALL + 1024) + 70_000  # over line_bytes (LINE_SLACK is less than 70,000)
    line = b'{"content": "' + b"x" * (4 * bound) + b'"}\n'
    out, read = read_from_file(
        lambda **k: memctl_bin("episode", "import", "-", **k), line, tmp_path
    )
    assert out.exit_code == 2 and "line 1: longer than" in out.stderr
    assert bound - 70_000 < read <= bound + READ_AHEAD, f"read {read:,} of {len(line):,} bytes"
    assert count(conn, "episodes") == 0


# ------------------------------------------------------------ times


def test_a_future_or_ancient_created_at_is_refused_on_every_path(cli, conn, memctl_env):
    for when in ("2030-01-01T00:00:00Z", "1899-12-31T23:59:59Z"):
        out = cli("episode", "add", "x", "--created-at", when)
        assert out.exit_code == 2 and "created_at" in out.stderr, out.stderr
        line = json.dumps({"content": "x", "created_at": when}) + "\n"
        out = cli("episode", "import", "-", input=line)
        assert out.exit_code == 2 and "line 1" in out.stderr
        header = cli("export").stdout.splitlines()[0]
        record = {"type": "episode", "id": 1, "agent": "a", "content": "x", "created_at": when}
        assert cli("import", "-", input=header + "\n" + json.dumps(record) + "\n").exit_code == 2
    future = cli("episode", "add", "x", "--created-at", "2030-01-01T00:00:00Z")
    assert "[limits] clock_skew" in future.stderr
    assert count(conn, "episodes") == 0
    limits(memctl_env, clock_skew="3650d")  # the skew is a setting
    assert cli("episode", "add", "x", "--created-at", "2030-01-01T00:00:00Z").exit_code == 0


def test_the_installed_binary_refuses_a_far_future_created_at_and_an_export_onto_a_fifo(
    memctl_bin, memctl_env, conn, tmp_path
):
    out = memctl_bin("episode", "add", "from the future", "--created-at", "2030-06-01T00:00:00Z")
    assert out.exit_code == 2 and "clock_skew" in out.stderr and out.stdout == ""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out = memctl_bin(
        "export", "--out", str(fifo), timeout=60
    )  # the old code blocked here or replaced it
    assert out.exit_code == 2 and "FIFO" in out.stderr and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert count(conn, "episodes") == 0


# ------------------------------------------------------------ files


def test_export_out_writes_only_a_regular_file(cli, memctl_env, tmp_path):
    assert cli("episode", "add", "something to export").exit_code == 0
    target = tmp_path / "victim"
    target.write_text("keep me")
    link = tmp_path / "link"
    link.symlink_to(target)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    folder = tmp_path / "dir"
    folder.mkdir()
    for path in (link, fifo, folder):
        out = cli("export", "--out", str(path))
        assert out.exit_code == 2 and "--out" in out.stderr and "untouched" in out.stderr, (
            out.stderr
        )
    assert link.is_symlink() and target.read_text() == "keep me"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and folder.is_dir()
    # A device: /dev/null is checked by the library first, so a regression cannot reach the real one.
    with pytest.raises(BadValue):
        files.regular_target("/dev/null")
    before = os.lstat("/dev/null")
    out = cli("export", "--out", "/dev/null")
    assert out.exit_code == 2 and "character device" in out.stderr
    after = os.lstat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (
        before.st_ino,
        before.st_rdev,
    )
    regular = tmp_path / "export.jsonl"
    regular.write_text("old")
    assert cli("export", "--out", str(regular)).exit_code == 0
    assert (
        "something to export" in regular.read_text()
        and stat.S_IMODE(regular.stat().st_mode) == 0o600
    )


def test_metrics_textfile_refuses_a_symlink(cli, tmp_path):
    target = tmp_path / "real.prom"
    target.write_text("keep")
    link = tmp_path / "memctl.prom"
    link.symlink_to(target)
    out = cli("metrics", "--textfile", str(link))
    assert out.exit_code == 2 and "--textfile" in out.stderr
    assert link.is_symlink() and target.read_text() == "keep"


# ------------------------------------------------------------ every field, one rule


def test_a_blocked_source_with_a_password_is_stored_redacted_and_still_blocks(cli, conn):
    out = cli("source", "block", FEED, "--reason", "spam")
    assert out.exit_code == 0 and URL_PW not in out.stdout + out.stderr
    stored = conn.execute("SELECT source FROM blocked_sources").fetchone()["source"]
    assert URL_PW not in stored and "feeds.example.com" in stored
    refused = cli("episode", "add", "let me in", "--source", FEED)
    assert refused.exit_code == 1 and "blocked" in refused.stderr and URL_PW not in refused.stderr
    assert cli("fact", "set", "k", "v", "--source", FEED).exit_code == 1
    assert cli("episode", "add", "me too", "--source", stored).exit_code == 1
    assert URL_PW not in cli("export").stdout
    assert count(conn, "episodes") == 0 and count(conn, "facts") == 0
    out = cli("source", "unblock", FEED)
    assert out.exit_code == 0 and URL_PW not in out.stderr
    assert count(conn, "blocked_sources") == 0


def test_a_fact_value_is_judged_by_its_stored_key_and_counted_once(cli, conn):
    out = cli("fact", "set", "password=Hunter2xyz", "v1", "-f", "json")
    assert out.exit_code == 0
    fact = conn.execute("SELECT key, value FROM facts").fetchone()
    history = conn.execute("SELECT new_value FROM fact_history").fetchone()
    assert (
        "Hunter2xyz" not in fact["key"] and fact["value"] == history["new_value"]
    )  # one rule: facts = history
    assert out.json()[0]["new_value"] == fact["value"]
    token = cli("fact", "set", f"token={GITHUB}", "v")
    assert (
        "redacted 2 secret(s)" in token.stderr
    )  # the key's token and the value under a token key, each stored
    stored = conn.execute(
        "SELECT f.value, h.new_value FROM facts f JOIN fact_history h USING (namespace, key) "
        "WHERE f.key LIKE 'token=%'"
    ).fetchone()
    assert stored["value"] == stored["new_value"] == "[REDACTED:secret-named]"
    scan = cli("redact", "scan", "-f", "json")
    assert scan.exit_code == 0 and not [
        h for h in scan.json() if h["column"] in ("value", "new_value")
    ]


def test_an_imported_run_record_is_redacted_in_every_field(cli, conn):
    header = cli("export").stdout.splitlines()[0]
    run = {
        "type": "runbook_run",
        "agent": "default",
        "name": f"deploy-{GITHUB}",
        "commit": f"token={GITHUB}",
        "started_at": "2026-08-01T00:00:00Z",
        "outcome": "ok",
        "steps": 1,
        "output_tail": f"pushed with {GITHUB}",
    }
    out = cli("import", "-", input=header + "\n" + json.dumps(run) + "\n")
    assert out.exit_code == 0, out.stderr
    row = conn.execute("SELECT name, commit, outcome, output_tail FROM runbook_runs").fetchone()
    assert GITHUB not in json.dumps(row) and all(
        "[REDACTED:" in row[c] for c in ("name", "commit", "output_tail")
    )
    bad = dict(run, outcome=f"ok {GITHUB}")
    out = cli("import", "-", input=header + "\n" + json.dumps(bad) + "\n")
    assert out.exit_code == 2 and "outcome" in out.stderr and GITHUB not in out.stderr


def test_redact_scan_finds_and_fixes_a_run_commit_stored_raw(cli, conn):
    conn.execute(
        WRITER + "INSERT INTO runbook_runs (agent, name, commit, steps, outcome, output_tail) "
        "VALUES ('default', 'rotate', %s, 1, 'ok', 'done')",
        (f"token={GITHUB}",),
    )  # planted raw
    scan = cli("redact", "scan", "-f", "json")
    assert [h["column"] for h in scan.json() if h["table"] == "runbook_runs"] == ["commit"]
    assert cli("redact", "scan", "--fix", "--yes").exit_code == 0
    assert GITHUB not in conn.execute("SELECT commit FROM runbook_runs").fetchone()["commit"]


def test_run_output_follows_the_mode_of_the_gate():
    text = f"pushed with {GITHUB}"
    assert GITHUB not in gate.Gate(None, None, redact.Redactor("redact")).run_output(text)
    with pytest.raises(redact.SecretRefused):
        gate.Gate(None, None, redact.Redactor("block")).run_output(text)


def test_export_import_of_a_redacted_database_is_the_identity(cli, conn, other_db):
    assert (
        cli(
            "episode",
            "add",
            f"deployed with {GITHUB} and {FEED}",
            "--source",
            FEED,
            "--meta",
            json.dumps({"token": GITHUB, "host": "web-1"}),
        ).exit_code
        == 0
    )
    assert cli("fact", "set", "password=Hunter2xyz", "v1").exit_code == 0
    assert cli("fact", "set", "db.password", "Hunter2xyz", "--source", FEED).exit_code == 0
    assert (
        cli(
            "source", "block", f"https://bot:{URL_PW}@spam.example.com", "--reason", f"key {GITHUB}"
        ).exit_code
        == 0
    )
    conn.execute(
        WRITER + "INSERT INTO runbook_runs (agent, name, commit, steps, outcome, output_tail) "
        "VALUES ('default', 'rotate [REDACTED:github-token]', '[REDACTED:github-token]', 1, 'ok', 'done')"
    )
    first = cli("export").stdout
    assert GITHUB not in first and URL_PW not in first and "Hunter2xyz" not in first
    into = cli("import", "-", "-f", "json", input=first, env={"MEMCTL_DATABASE_URL": other_db})
    assert into.exit_code == 0 and into.json()[0]["redacted"] == 0, into.stderr
    second = cli("export", env={"MEMCTL_DATABASE_URL": other_db}).stdout

    def comparable(text: str) -> list:
        kept = []
        for record in map(json.loads, text.splitlines()):
            record.pop("exported_at", None)
            record.pop("id", None)
            record.pop("episode_id", None)
            kept.append(json.dumps(record, sort_keys=True))
        return sorted(kept)

    assert comparable(first) == comparable(second)


# ------------------------------------------------------------ MCP


def test_mcp_remember_refuses_at_the_one_limit_and_echoes_the_stored_kind(
    conn, memctl_env, tmp_path
):
    from tests.fix_mcp import run, serving, stderr_of

    log = tmp_path / "mcp.log"
    limits(memctl_env, episode_bytes=SMALL)

    async def scenario():
        async with serving(log, "--agent", "a") as s:
            refused = await s.error("remember", content="x" * (SMALL + 1))
            assert "[limits] episode_bytes" in refused
            assert (await s.ok("remember", content="x" * SMALL))[
                "stored"
            ]  # 128 KiB: past the old 100,000
            stored = await s.call("remember", content="the feed moved", kind=f"feed {GITHUB}")
            assert not stored.is_error
            assert GITHUB not in json.dumps(stored.model_dump(mode="json"))
            assert stored.structured_content["kind"].startswith("feed [REDACTED:")
            changed = await s.call("fact_set", key=f"token={GITHUB}", value="v")
            assert GITHUB not in json.dumps(changed.model_dump(mode="json"))

    run(scenario)
    stderr_of(log, GITHUB)
    kinds = [r["kind"] for r in conn.execute("SELECT kind FROM episodes ORDER BY id").fetchall()]
    assert len(kinds) == 2 and GITHUB not in kinds[1]
