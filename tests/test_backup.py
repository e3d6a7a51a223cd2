"""memctl backup, backup verify, restore: consistent while agents write, whole or absent, checked, rotated.

The restore drill (test_restore_drill_while_agents_write) takes a backup while writer threads keep
writing, destroys the database (the embedded data directory; on an operator's server, the database is
dropped and made again, empty), restores the backup, and checks by content hash that exactly the writes
the backup's snapshot saw are back, each whole, none half.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from memctl.backup import backup, backup_file, pgtools
from tests.conftest import drop_database, fresh_database


def configure(memctl_env, tmp_path, extra: str = "") -> Path:
    """Backups (and a restore's safety backups) under tmp_path, never in a real MEMCTL_HOME."""
    directory = tmp_path / "backups"
    Path(memctl_env["MEMCTL_CONFIG"]).write_text(f'[backup]\ndir = "{directory}"\n{extra}')
    return directory


def count(conn, table: str) -> int:
    return conn.execute(
        sql.SQL("SELECT count(*) AS n FROM {}").format(sql.Identifier(table))
    ).fetchone()["n"]


def take(cli, *args: str) -> Path:
    out = cli("backup", "-f", "json", *args)
    assert out.exit_code == 0, out.stderr
    return Path(out.json()["file"])


def fill(cli) -> None:
    for n in range(3):
        assert cli("fact", "set", f"host.{n}", f"10.0.0.{n}").exit_code == 0
        assert (
            cli("episode", "add", f"deploy {n} failed: disk full, rotating logs fixed it").exit_code
            == 0
        )
    assert cli("embed").exit_code == 0


def test_a_backup_is_one_private_file_with_a_manifest_of_its_snapshot(
    cli, conn, memctl_env, tmp_path
):
    directory = configure(memctl_env, tmp_path)
    fill(cli)
    path = take(cli)
    assert path.parent == directory and backup.NAME.match(path.name)
    assert path.stat().st_mode & 0o777 == 0o600 and directory.stat().st_mode & 0o777 == 0o700
    assert sorted(os.listdir(directory)) == [path.name]  # no temporary file or directory left
    with tarfile.open(path) as tar:
        assert tar.getnames() == [backup_file.MANIFEST, backup_file.DUMP, backup_file.SUMS]
        data = {name: tar.extractfile(name).read() for name in tar.getnames()}
    manifest = backup_file.read_manifest(path)
    dump = data[backup_file.DUMP]
    assert manifest["dump"]["sha256"] == hashlib.sha256(dump).hexdigest() and manifest["dump"][
        "bytes"
    ] == len(dump)
    assert data[backup_file.SUMS].decode() == "".join(  # what sha256sum -c reads
        f"{hashlib.sha256(data[name]).hexdigest()}  {name}\n"
        for name in (backup_file.MANIFEST, backup_file.DUMP)
    )
    assert manifest["records"]["facts"] == 3 and manifest["records"]["episodes"] == 3
    assert manifest["server"]["version_num"] == conn.info.server_version
    assert manifest["pg_dump"]["major"] >= conn.info.server_version // 10000
    from memctl import __version__

    assert manifest["memctl_version"] == __version__ and manifest["migration"].endswith(".sql")
    vector_tables = [t for t in manifest["tables"] if t.startswith("vectors_")]
    assert (
        vector_tables and manifest["tables"][vector_tables[0]]["rows"] == 3
    )  # the embeddings are in it
    for table, entry in manifest["tables"].items():
        assert entry["rows"] == count(conn, table) - (table == "jobs"), (
            table
        )  # less this run's own row
    assert (
        "tsv" not in manifest["tables"]["episodes"]["columns"]
    )  # generated: recomputed by the server

    [job] = conn.execute("SELECT outcome, rows, detail FROM jobs WHERE job = 'backup'").fetchall()
    assert (job["outcome"], job["rows"], job["detail"]["file"]) == ("ok", 6, str(path))
    assert job["detail"]["bytes"] == path.stat().st_size
    # The job log in the backup does not hold this run as still running: its row came after the snapshot.
    assert manifest["tables"]["jobs"]["rows"] == count(conn, "jobs") - 1 == 1


def test_verify_passes_and_a_tampered_or_damaged_backup_fails(
    cli, conn, memctl_env, tmp_path, pg_server
):
    configure(memctl_env, tmp_path)
    fill(cli)
    path = take(cli)
    ok = cli("backup", "verify", str(path), "-f", "json")
    assert ok.exit_code == 0, ok.stderr
    assert all(row["ok"] for row in ok.json()) and {r["table"] for r in ok.json()} >= {
        "facts",
        "episodes",
    }
    assert "backup verified" in ok.stderr

    out = cli("backup", "verify", str(flip_a_dump_byte(path, tmp_path / "flipped.tar")))
    assert out.exit_code == 1 and "damaged backup" in out.stderr and "sha256" in out.stderr

    lying = rewrite_manifest(
        path, tmp_path / "lying.tar", lambda m: m["tables"]["facts"].update(rows=4)
    )
    out = cli("backup", "verify", str(lying), "-f", "json")
    assert out.exit_code == 1 and "facts" in out.stderr
    assert [r["table"] for r in out.json() if not r["ok"]] == ["facts"]
    altered = rewrite_manifest(
        path, tmp_path / "altered.tar", lambda m: m["tables"]["episodes"].update(checksum="12345")
    )
    out = cli("backup", "verify", str(altered), "-f", "json")
    assert out.exit_code == 1 and [r["checksum"] for r in out.json() if not r["ok"]] == ["DIFFERS"]

    edited = rewrite_manifest(
        path, tmp_path / "edited.tar", lambda m: m.update(memctl_version="9.9.9"), consistent=False
    )
    out = cli("backup", "verify", str(edited))
    assert (
        out.exit_code == 1 and "manifest.json differs from its sha256 in SHA256SUMS" in out.stderr
    )
    whole = path.read_bytes()
    for name, data in (
        ("truncated", whole[: len(whole) // 2]),
        ("appended", whole + b"more"),
        ("padding", flip(whole, len(whole) - 100)),
    ):  # a byte of the tar's end
        (tmp_path / f"{name}.tar").write_bytes(data)
        out = cli("backup", "verify", str(tmp_path / f"{name}.tar"))
        assert out.exit_code == 1 and "damaged backup" in out.stderr, name
    notes = tmp_path / "notes.txt"
    notes.write_text("not a backup\n")
    out = cli("backup", "verify", str(notes))
    assert (
        out.exit_code == 1 and "not a memctl backup" in out.stderr and "Traceback" not in out.stderr
    )
    assert cli("backup", "verify", str(tmp_path / "missing.tar")).exit_code == 4
    with psycopg.connect(pg_server) as admin:  # every scratch database was dropped
        assert (
            admin.execute(
                "SELECT count(*) FROM pg_database WHERE datname LIKE 'memctl_verify_%'"
            ).fetchone()[0]
            == 0
        )


def flip(data: bytes, at: int) -> bytes:
    changed = bytearray(data)
    changed[at] ^= 0xFF
    return bytes(changed)


def flip_a_dump_byte(path: Path, target: Path) -> Path:
    """A copy of a backup with one byte in the middle of its dump changed."""
    with tarfile.open(path) as tar:
        member = tar.getmember(backup_file.DUMP)
    target.write_bytes(flip(path.read_bytes(), member.offset_data + member.size // 2))
    return target


def rewrite_manifest(path: Path, target: Path, change, *, consistent: bool = True) -> Path:
    """A copy of a backup whose manifest was edited, its dump untouched: a consistent forgery (SHA256SUMS
    made anew) or a plain edit (SHA256SUMS kept)."""
    with tarfile.open(path) as tar:
        manifest = json.loads(tar.extractfile(backup_file.MANIFEST).read())
        dump = tar.extractfile(backup_file.DUMP).read()
        sums = tar.extractfile(backup_file.SUMS).read()
    change(manifest)
    data = json.dumps(manifest).encode()
    if consistent:
        sums = (
            f"{hashlib.sha256(data).hexdigest()}  {backup_file.MANIFEST}\n{manifest['dump']['sha256']}  "
            f"{backup_file.DUMP}\n".encode()
        )
    with tarfile.open(target, "w") as tar:
        for name, content in (
            (backup_file.MANIFEST, data),
            (backup_file.DUMP, dump),
            (backup_file.SUMS, sums),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return target


def test_verify_into_an_empty_database_the_operator_names(
    cli, memctl_env, tmp_path, empty_db_url, db_url
):
    configure(memctl_env, tmp_path)
    fill(cli)
    path = take(cli)
    out = cli("backup", "verify", str(path), env={"MEMCTL_SCRATCH_URL": empty_db_url})
    assert out.exit_code == 0, out.stderr
    with psycopg.connect(
        empty_db_url
    ) as scratch:  # the operator's database is left as verify made it
        assert scratch.execute("SELECT count(*) FROM facts").fetchone()[0] == 3
    out = cli(
        "backup", "verify", str(path), "--scratch-url", db_url
    )  # not empty: refused, untouched
    assert out.exit_code == 1 and "empty database only" in out.stderr


@pytest.mark.writer_check_off
def test_restore_replaces_memory_after_a_safety_backup(cli, conn, memctl_env, tmp_path):
    directory = configure(memctl_env, tmp_path)
    fill(cli)
    path = take(cli)
    assert cli("fact", "set", "written.after", "the backup").exit_code == 0
    assert cli("episode", "add", "an episode after the backup").exit_code == 0

    refused = cli("restore", str(path))
    assert refused.exit_code == 2 and "--yes" in refused.stderr
    assert count(conn, "facts") == 4

    out = cli("restore", str(path), "--yes", "-f", "json")
    assert out.exit_code == 0, out.stderr
    assert (count(conn, "facts"), count(conn, "episodes")) == (3, 3)
    assert cli("fact", "get", "written.after").exit_code == 4
    safety = Path(out.json()["safety_backup"])
    assert safety.parent == directory and safety.name.startswith(backup.SAFETY_PREFIX)
    assert safety.stat().st_mode & 0o777 == 0o600
    from memctl.db import migrate

    assert all(m.status == "applied" for m in migrate.plan(conn))  # the schema is current
    [job] = conn.execute("SELECT outcome, rows, detail FROM jobs WHERE job = 'restore'").fetchall()
    assert (
        job["outcome"] == "ok"
        and job["rows"] == 6
        and job["detail"]["safety_backup"] == str(safety)
    )
    vectors = [t for t in backup.tables(conn) if t.startswith("vectors_")]
    assert count(conn, vectors[0]) == 3  # embeddings restored, not queued again
    found = cli("episode", "search", "rotating logs", "-f", "jsonl")
    assert found.exit_code == 0 and "rotating logs" in found.stdout

    # The safety backup undoes the restore, and rotation never deletes it.
    assert cli("backup", "--keep-daily", "1", "--keep-weekly", "0").exit_code == 0
    assert safety.exists()
    assert cli("restore", str(safety), "--yes").exit_code == 0
    assert cli("fact", "get", "written.after", "-f", "json").json()["value"] == "the backup"


@pytest.mark.writer_check_off
def test_a_restore_that_does_not_match_its_manifest_changes_nothing(
    cli, conn, memctl_env, tmp_path
):
    configure(memctl_env, tmp_path)
    fill(cli)
    lying = rewrite_manifest(
        take(cli), tmp_path / "lying.tar", lambda m: m["tables"]["episodes"].update(rows=2)
    )
    assert cli("fact", "set", "written.after", "the backup").exit_code == 0
    out = cli("restore", str(lying), "--yes")
    assert (
        out.exit_code == 1
        and "differs from the backup manifest" in out.stderr
        and "nothing was changed" in out.stderr
    )
    assert count(conn, "facts") == 4 and cli("fact", "get", "written.after").exit_code == 0

    out = cli("restore", str(flip_a_dump_byte(lying, tmp_path / "damaged.tar")), "--yes")
    assert out.exit_code == 1 and "damaged backup" in out.stderr
    assert count(conn, "facts") == 4


def test_a_backup_that_cannot_start_is_in_the_job_log_and_status(cli, conn, memctl_env, tmp_path):
    configure(memctl_env, tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = cli("backup", "--to", str(blocker / "backups"))
    assert out.exit_code == 1 and "cannot create the backup directory" in out.stderr
    [job] = conn.execute("SELECT outcome, error FROM jobs WHERE job = 'backup'").fetchall()
    assert job["outcome"] == "failed" and "backup directory" in job["error"]
    status = cli("status", "--check", "-f", "json")
    assert status.exit_code == 1
    assert any(
        "backup has never completed a run: the last one ended failed" in w
        for w in status.json()["warnings"]
    )
    assert cli("backup", "--keep-daily", "-1").exit_code == 2


def test_a_backup_restores_into_a_newer_postgresql(cli, memctl_env, tmp_path, pg_role):
    if pg_role.server_version // 10000 >= 18:
        pytest.skip(
            "the test server is as new as the embedded PostgreSQL 18; this runs against an older one "
            "(MEMCTL_TEST_DATABASE_URL, CI step 3: PostgreSQL 15)"
        )
    configure(memctl_env, tmp_path)
    fill(cli)
    path = take(cli)
    home = Path(tempfile.mkdtemp(prefix="memctl-test-newer-"))
    newer = Drill({**os.environ, "MEMCTL_HOME": str(home), "MEMCTL_DATABASE_URL": ""})
    try:
        restored = newer.run(
            "restore", str(path), "--yes"
        )  # an empty embedded server, PostgreSQL 18
        assert restored.returncode == 0, restored.stderr
        listed = newer.run("fact", "list", "-f", "json")
        assert sorted(f["key"] for f in json.loads(listed.stdout)) == ["host.0", "host.1", "host.2"]
        found = newer.run(
            "episode", "search", "rotating logs", "--mode", "vector", "-f", "jsonl", "--no-track"
        )
        assert found.returncode == 0 and "rotating logs" in found.stdout  # the vectors came along
    finally:
        newer.run("db", "stop")
        shutil.rmtree(home, ignore_errors=True)


# --- rotation -------------------------------------------------------------------------------------


def utc(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.timezone.utc)


SERIES = {  # newest first; 2026-08-12 is a Wednesday of ISO week 33
    "A": "2026-08-12T10:00",
    "B": "2026-08-12T09:00",
    "C": "2026-08-11T12:00",
    "D": "2026-08-11T08:00",
    "E": "2026-08-09T12:00",
    "F": "2026-08-05T12:00",
    "G": "2026-07-29T12:00",
    "H": "2026-07-20T12:00",
}


@pytest.mark.parametrize(
    "daily, weekly, kept",
    [
        (3, 3, "ACEG"),  # days 08-12, 08-11, 08-09; weeks 33, 32, 31
        (1, 0, "A"),
        (0, 2, "AE"),
        (10, 0, "ACEFGH"),
        (0, 10, "AEGH"),
    ],
)
def test_rotation_keeps_what_restic_forget_keeps(daily, weekly, kept):
    found = [(Path(name), utc(when)) for name, when in SERIES.items()]
    assert "".join(sorted(str(p) for p in backup.kept(found, daily, weekly))) == kept


def test_rotate_deletes_only_backups_and_stale_leftovers(tmp_path):
    names = {key: f"memctl-backup-{utc(when):%Y%m%dT%H%M%S}Z.tar" for key, when in SERIES.items()}
    for name in names.values():
        (tmp_path / name).write_text("")
    (tmp_path / "memctl-backup-20260812T100000Z-1.tar").write_text(
        ""
    )  # a second one that second: the newest
    others = ["memctl-before-restore-20260101T000000Z.tar", "notes.txt", "memctl-backup-latest.tar"]
    for name in others:
        (tmp_path / name).write_text("")
    stale, fresh = tmp_path / ".memctl-backup-x.tmp", tmp_path / ".memctl-backup-y.tar.abc.tmp"
    stale.mkdir()
    fresh.write_text("")
    os.utime(stale, (time.time() - 2 * backup.STALE_S,) * 2)

    assert (
        backup.rotate(tmp_path, 0, 0) == []
    )  # no policy: everything kept (leftovers still cleaned)
    assert not stale.exists() and fresh.exists()
    removed = {p.name for p in backup.rotate(tmp_path, 3, 3)}
    assert removed == {names[k] for k in "ABDFH"}  # A lost to the later -1 of the same second
    assert sorted(os.listdir(tmp_path)) == sorted(
        [
            *others,
            fresh.name,
            "memctl-backup-20260812T100000Z-1.tar",
            names["C"],
            names["E"],
            names["G"],
        ]
    )


@pytest.mark.writer_check_off
def test_the_newest_client_programs_restore_into_this_server(db_url, tmp_path, conn):
    """A dump by a newer pg_dump than the server (the wheel's 18 on PostgreSQL 15) restores: the header
    settings an older server lacks (SET transaction_timeout) are left out."""
    from memctl.records import facts
    from memctl.backup import restore

    facts.set_fact(conn, "k", "v")
    newest = pgtools.toolsets()[-1]
    major = conn.info.server_version // 10000
    assert newest.major >= major and pgtools.for_dump(major).major >= major
    assert pgtools.for_restore(major, newest.major).major >= newest.major
    dump = tmp_path / "newest.dump"
    with pgtools.connection_env(db_url) as env:
        pgtools.run([newest["pg_dump"], "-Fc", "-n", "public", "-f", str(dump)], env)
        facts.set_fact(conn, "k", "changed")
        listing = pgtools.listing(newest, dump, tmp_path / "list")
        prepare = restore._prepare("public", drop=True).as_string(conn)
        pgtools.restore_script(
            newest, dump, listing, env, server_major=major, before=prepare, after="SELECT 1"
        )
    assert facts.get_fact(conn, "k").value == "v"


def test_a_dump_that_breaks_off_changes_nothing(db_url, tmp_path, conn):
    """pg_restore failing halfway through its script: psql is stopped before its input ends, nothing commits."""
    from memctl.errors import MemctlError
    from memctl.records import facts
    from memctl.backup import restore

    for n in range(50):
        facts.set_fact(conn, f"k{n}", "v" * 200)
    major = conn.info.server_version // 10000
    tools = pgtools.for_dump(major)
    dump = tmp_path / "cut.dump"
    with pgtools.connection_env(db_url) as env:
        pgtools.run([tools["pg_dump"], "-Fc", "-n", "public", "-f", str(dump)], env)
        facts.set_fact(conn, "k0", "changed")
        listing = pgtools.listing(tools, dump, tmp_path / "list")
        dump.write_bytes(dump.read_bytes()[: dump.stat().st_size * 3 // 4])
        prepare = restore._prepare("public", drop=True).as_string(conn)
        with pytest.raises(MemctlError, match="pg_restore failed"):
            pgtools.restore_script(
                tools, dump, listing, env, server_major=major, before=prepare, after="SELECT 1"
            )
    assert facts.get_fact(conn, "k0").value == "changed" and count(conn, "facts") == 50


# --- the restore drill ------------------------------------------------------------------------------


@dataclass
class Write:
    xid: int
    content: str
    started: float
    acked: float

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.content.encode()).hexdigest()


def _memctl() -> str:
    beside = Path(sys.executable).parent / "memctl"
    return str(beside) if beside.exists() else shutil.which("memctl")


class Drill:
    """memctl's database for the drill, and a way to destroy it: the embedded server's data directory in a
    MEMCTL_HOME of its own, or (MEMCTL_TEST_DATABASE_URL) a database dropped and made again, empty."""

    def __init__(self, env: dict, admin: str | None = None, name: str | None = None):
        self.env, self.admin, self.name = env, admin, name

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [_memctl(), *args], env=self.env, capture_output=True, text=True, timeout=300
        )

    def url(self) -> str:
        if self.admin is None:
            out = self.run("db", "url")
            assert out.returncode == 0, out.stderr
            return out.stdout.strip()
        return self.env["MEMCTL_DATABASE_URL"]

    def destroy(self) -> None:
        if self.admin is None:
            assert self.run("db", "stop").returncode == 0
            shutil.rmtree(Path(self.env["MEMCTL_HOME"]) / "pgdata")
        else:
            with psycopg.connect(self.admin, autocommit=True) as conn:
                drop_database(conn, self.name)
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))


@pytest.fixture
def drill(pg_role, pg_server, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(f'[backup]\ndir = "{tmp_path / "backups"}"\n')
    env = {
        **os.environ,
        "MEMCTL_CONFIG": str(config),
        "MEMCTL_EMBEDDER": "hash",
        "MEMCTL_EMBED_MODEL": "hash-embed",
    }
    if pg_role.embedded:
        home = Path(tempfile.mkdtemp(prefix="memctl-test-drill-"))
        drill = Drill({**env, "MEMCTL_HOME": str(home), "MEMCTL_DATABASE_URL": ""})
        try:
            yield drill
        finally:
            drill.run("db", "stop")
            shutil.rmtree(home, ignore_errors=True)
    else:
        from psycopg.conninfo import conninfo_to_dict

        with fresh_database(pg_server, prefix="memctl_drill") as url:
            yield Drill(
                {**env, "MEMCTL_DATABASE_URL": url}, pg_server, conninfo_to_dict(url)["dbname"]
            )


def writer(url: str, config: str, number: int, log: list[Write], stop: threading.Event) -> None:
    """Each write is an episode and a fact change in one transaction, acknowledged when the commit returns."""
    from memctl import config as config_mod, db
    from memctl.records import episodes, facts

    settings = config_mod.load(Path(config), environ={})
    with db.connect(url) as conn:
        n = 0
        while not stop.is_set():
            content = (
                f"writer {number} wrote note {n}: the deploy of service {number} needed step {n}"
            )
            started = time.time()
            with conn.transaction():
                xid = int(conn.execute("SELECT pg_current_xact_id()::text AS x").fetchone()["x"])
                episodes.add(conn.use_settings(settings), content, agent=f"writer{number}")
                facts.set_fact(conn, f"writer{number}.last", content, settings=settings)
            log.append(Write(xid, content, started, time.time()))
            n += 1


def visible(snapshot: str, xid: int) -> bool:
    """pg_visible_in_snapshot, from the text of a pg_snapshot (xmin:xmax:xip,...)."""
    xmin, xmax, xip = snapshot.split(":")
    return xid < int(xmin) or (xid < int(xmax) and str(xid) not in xip.split(","))


def wait_for(condition, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the writers stopped writing"
        time.sleep(0.05)


def test_restore_drill_while_agents_write(drill, tmp_path):
    assert (
        drill.run("fact", "set", "drill.started", "yes").returncode == 0
    )  # starts and migrates the database
    url = drill.url()
    logs: list[list[Write]] = [[] for _ in range(3)]
    stop = threading.Event()
    threads = [
        threading.Thread(target=writer, args=(url, drill.env["MEMCTL_CONFIG"], n, logs[n], stop))
        for n in range(3)
    ]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: all(len(log) >= 10 for log in logs))
        assert drill.run("embed").returncode == 0  # some vectors to back up as well
        began = time.time()
        out = drill.run("backup", "--to", str(tmp_path / "drill"), "-f", "json")
        ended = time.time()
        assert out.returncode == 0, out.stderr
        wait_for(lambda: all(sum(w.started > ended for w in log) >= 5 for log in logs))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    path = Path(json.loads(out.stdout)["file"])
    manifest = backup_file.read_manifest(path)
    writes = [w for log in logs for w in log]
    snapshot, taken = (
        manifest["snapshot"],
        datetime.datetime.fromisoformat(manifest["created_at"]).timestamp(),
    )
    assert all(visible(snapshot, w.xid) for w in writes if w.acked < taken)
    assert all(visible(snapshot, w.xid) for w in writes if w.acked < began)
    assert not any(visible(snapshot, w.xid) for w in writes if w.started > ended)
    assert (
        sum(w.acked < began for w in writes) >= 30 and sum(w.started > ended for w in writes) >= 15
    )

    drill.destroy()
    restored = drill.run("restore", str(path), "--yes")
    assert restored.returncode == 0, restored.stderr

    with psycopg.connect(drill.url()) as conn:
        episodes = {
            hashlib.sha256(c.encode()).hexdigest(): n
            for c, n in conn.execute(
                "SELECT e.content, (SELECT count(*) FROM chunks c WHERE c.agent = e.agent AND c.episode_id = e.id) "
                "FROM episodes e WHERE e.agent LIKE 'writer%'"
            )
        }
        history = {
            hashlib.sha256(v.encode()).hexdigest()
            for (v,) in conn.execute("SELECT new_value FROM fact_history WHERE key LIKE 'writer%'")
        }
        vectors = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(
                sql.Identifier(
                    conn.execute(
                        "SELECT table_name FROM embedding_models WHERE state = 'active'"
                    ).fetchone()[0]
                )
            )
        ).fetchone()[0]
    for w in (
        writes
    ):  # exactly the snapshot's writes, each whole: its episode, its chunks and its fact change
        seen = visible(snapshot, w.xid)
        assert (w.digest in episodes, w.digest in history) == (seen, seen), w
        assert not seen or episodes[w.digest] >= 1, w
    assert len(episodes) == sum(visible(snapshot, w.xid) for w in writes)
    assert (
        vectors
        == next(t["rows"] for name, t in manifest["tables"].items() if name.startswith("vectors_"))
        > 0
    )
    assert drill.run("backup", "verify", str(path)).returncode == 0


@pytest.mark.parametrize(
    "stderr, code",
    [
        (  # what CI's soak saw when the server was killed under a scheduled backup
            'pg_dump: error: Dumping the contents of table "vectors_1_nomic_embed_text_768" failed: '
            "PQgetCopyData() failed.\npg_dump: detail: Error message from server: server closed the "
            "connection unexpectedly\n\tThis probably means the server terminated abnormally",
            3,
        ),
        (
            'pg_dump: error: connection to server at "127.0.0.1", port 5999 failed: Connection refused',
            3,
        ),
        ('pg_dump: error: query failed: ERROR:  permission denied for table "facts"', 1),
        ("pg_restore: error: could not read input file: end of file", 1),
    ],
)
def test_a_client_program_that_lost_its_server_fails_as_unavailable(stderr, code):
    """A pg_dump or psql that failed because the server went away is exit 3 (unavailable, retried by the
    timer), as memctl's own connections are; any other failure of theirs stays exit 1."""
    failed = pgtools.failure("pg_dump", stderr.encode())
    assert failed.exit_code == code and str(failed).startswith("pg_dump failed: "), failed
