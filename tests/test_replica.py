"""Search from a read replica: [database] read_url against a real streaming standby.

The standby is a base backup of the tests' embedded server (the wheel's pg_basebackup -R -X stream),
started with the wheel's pg_ctl in its own directory and socket directory, as the server's system user
when run as root. Proof that a read came from the standby: replay is paused there, a row is written on
the primary, and the read does not see it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

WAIT = 30.0  # seconds a standby gets to start or to replay; a limit, not an assertion


@dataclass
class Standby:
    socket_dir: Path
    port: int

    def url(self, primary_url: str) -> str:
        """The same database as primary_url, on the standby."""
        return make_conninfo(primary_url, host=str(self.socket_dir), port=str(self.port))

    def connect(self, primary_url: str):
        return psycopg.connect(self.url(primary_url), autocommit=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(args: list[str], user: str | None) -> None:
    proc = subprocess.run(args, capture_output=True, text=True, user=user, timeout=120)
    assert proc.returncode == 0, f"{Path(args[0]).name} failed: {proc.stderr.strip()}"


def _until(check, what: str):
    deadline = time.monotonic() + WAIT
    while True:
        try:
            value = check()
        except psycopg.OperationalError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {WAIT:.0f} s")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def standby(pg_server):
    """A hot standby of the tests' embedded server, streaming from it; stopped at the end of the module."""
    if os.environ.get("MEMCTL_TEST_DATABASE_URL"):
        pytest.skip(
            "a standby is made with pg_basebackup of the tests' embedded server; with "
            "MEMCTL_TEST_DATABASE_URL set the server is another one, and a base backup needs the "
            "replication privilege and the server's files"
        )
    from memctl.db import embedded

    user = embedded.SYSTEM_USER if embedded.is_root() else None
    bin_dir = embedded.bin_dir()
    primary = conninfo_to_dict(pg_server)
    base = Path(tempfile.mkdtemp(prefix="memctl-standby-"))
    data, sock = base / "data", base / "sock"
    for path in (data, sock):
        path.mkdir(mode=0o700)
    if user is not None:
        for path in (base, data, sock):
            shutil.chown(path, user, user)
    port = _free_port()
    _run(
        [
            str(bin_dir / "pg_basebackup"),
            "-D",
            str(data),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "-w",
            "-h",
            primary["host"],
            "-p",
            str(primary.get("port", 5432)),
            "-U",
            primary.get("user", "postgres"),
        ],
        user,
    )
    _run(
        [
            str(bin_dir / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(base / "log"),
            "-w",
            "-t",
            "60",
            "-o",
            f"-p {port} -k {sock} -h ''",
            "start",
        ],
        user,
    )
    node = Standby(sock, port)
    try:
        admin = node.url(pg_server)
        with psycopg.connect(admin, autocommit=True) as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone()[0], (
                "the copy is not a standby"
            )
        _until(lambda: _streaming(pg_server), "the standby to stream from the primary")
        yield node
    finally:
        subprocess.run(
            [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
            capture_output=True,
            user=user,
            timeout=60,
        )
        shutil.rmtree(base, ignore_errors=True)


def _streaming(primary_url: str) -> bool:
    with psycopg.connect(primary_url, autocommit=True) as conn:
        return bool(
            conn.execute(
                "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
            ).fetchone()[0]
        )


def _replayed(primary_url: str, node: Standby) -> None:
    """Wait until the standby has replayed everything the primary has written so far."""
    with psycopg.connect(primary_url, autocommit=True) as conn:
        lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    admin = make_conninfo(node.url(primary_url), dbname="postgres")

    def done():
        with psycopg.connect(admin, autocommit=True) as conn:
            return conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)).fetchone()[
                0
            ]

    _until(done, f"the standby to replay up to {lsn}")


def _pause(node: Standby, primary_url: str, paused: bool) -> None:
    with psycopg.connect(
        make_conninfo(node.url(primary_url), dbname="postgres"), autocommit=True
    ) as conn:
        conn.execute("SELECT pg_wal_replay_pause()" if paused else "SELECT pg_wal_replay_resume()")
        if paused:
            _until(
                lambda: (
                    conn.execute("SELECT pg_get_wal_replay_pause_state()").fetchone()[0] == "paused"
                ),
                "replay to pause",
            )


def _ids(outcome) -> set[int]:
    assert outcome.exit_code == 0, outcome.stderr
    return {hit["id"] for hit in outcome.json()}


def _access(conn, episode_id: int) -> int:
    row = conn.execute(
        "SELECT access_count FROM episode_access WHERE episode_id = %s", (episode_id,)
    ).fetchone()
    return row["access_count"] if row else 0


def test_reads_come_from_the_standby_and_writes_and_access_counts_go_to_the_primary(
    cli, db_url, conn, pg_server, standby
):
    older = int(
        cli("episode", "add", "disk full on db01, rotated the logs", "--agent", "ops").stdout
    )
    assert cli("fact", "set", "db.port", "5432").exit_code == 0
    embedded = cli("embed")
    assert embedded.exit_code == 0, embedded.stderr
    _replayed(pg_server, standby)
    read = {"MEMCTL_READ_DATABASE_URL": standby.url(db_url)}
    _pause(standby, pg_server, True)
    try:
        # writes with read_url set still go to the primary
        added = cli(
            "episode", "add", "disk full on db02, rotated the logs too", "--agent", "ops", env=read
        )
        assert added.exit_code == 0, added.stderr
        newer = int(added.stdout)
        assert cli("fact", "set", "db.host", "10.8.0.4", env=read).exit_code == 0
        assert (
            conn.execute("SELECT count(*) AS n FROM episodes WHERE id = %s", (newer,)).fetchone()[
                "n"
            ]
            == 1
        )
        assert (
            conn.execute("SELECT value FROM facts WHERE key = 'db.host'").fetchone()["value"]
            == "10.8.0.4"
        )

        # reads with read_url set answer from the paused standby: the newer rows are not there yet
        replica = cli("episode", "search", "disk full rotated logs", "-f", "json", env=read)
        assert _ids(replica) == {older}
        assert "text search only" not in replica.stderr  # the standby has the model and vectors too
        assert _ids(cli("episode", "search", "disk full rotated logs", "-f", "json")) == {
            older,
            newer,
        }
        assert cli("fact", "get", "db.port", env=read).stdout == "5432\n"
        missing = cli("fact", "get", "db.host", env=read)
        assert missing.exit_code == 4, missing.stdout
        assert [r["key"] for r in cli("fact", "list", "-f", "json", env=read).json()] == ["db.port"]
        assert [r["key"] for r in cli("fact", "list", "-f", "json").json()] == [
            "db.host",
            "db.port",
        ]
        recalled = cli("recall", "disk full rotated logs", "-f", "json", env=read)
        assert recalled.exit_code == 0, recalled.stderr
        episodes = [i["id"] for i in recalled.json()["items"] if i["kind"] == "episode"]
        assert episodes == [older]

        # the searches above counted their hits on the primary: two replica reads and one primary read
        assert _access(conn, older) == 3
        assert _access(conn, newer) == 1
    finally:
        _pause(standby, pg_server, False)
    _replayed(pg_server, standby)
    assert _ids(
        cli("episode", "search", "disk full rotated logs", "-f", "json", "--no-track", env=read)
    ) == {older, newer}
    assert _access(conn, older) == 3


def test_an_unreachable_primary_costs_the_access_counts_and_one_note(
    cli, db_url, conn, pg_server, standby
):
    first = int(cli("episode", "add", "certificate expired on the load balancer").stdout)
    assert cli("fact", "set", "lb.cert", "renewed").exit_code == 0
    _replayed(pg_server, standby)
    env = {
        "MEMCTL_READ_DATABASE_URL": standby.url(db_url),
        "MEMCTL_DATABASE_URL": make_conninfo(
            db_url, host=str(standby.socket_dir.parent / "nowhere")
        ),
    }
    found = cli("episode", "search", "certificate expired", "-f", "json", env=env)
    assert found.exit_code == 0, found.stderr
    assert [h["id"] for h in found.json()] == [first]
    assert (
        "access counts not recorded: cannot open the primary (database unavailable" in found.stderr
    )
    assert sum("access counts" in line for line in found.stderr.splitlines()) == 1, found.stderr
    # nothing to record, so the primary is never asked for: no note
    quiet = cli("episode", "search", "certificate expired", "-f", "json", "--no-track", env=env)
    assert quiet.exit_code == 0, quiet.stderr
    assert "access counts" not in quiet.stderr and "primary" not in quiet.stderr, quiet.stderr
    got = cli("fact", "get", "lb.cert", env=env)
    assert (got.exit_code, got.stdout, got.stderr) == (0, "renewed\n", "")
    assert _access(conn, first) == 0


def test_a_standby_as_the_only_database_reads_and_leaves_the_counts_alone(
    cli, db_url, conn, pg_server, standby
):
    from memctl import db
    from memctl.records import access

    first = int(cli("episode", "add", "backup job ran out of disk").stdout)
    _replayed(pg_server, standby)
    with db.connect(standby.url(db_url)) as replica:
        assert (
            access.record(replica, [("default", first)]) == 0
        )  # ReadOnlySqlTransaction, swallowed
    found = cli(
        "episode",
        "search",
        "backup disk",
        "-f",
        "json",
        env={"MEMCTL_DATABASE_URL": standby.url(db_url)},
    )
    assert [h["id"] for h in found.json()] == [first]
    assert _access(conn, first) == 0


def test_a_replica_that_is_down_or_behind_is_reported_and_the_primary_answers(
    cli, db_url, empty_db_url
):
    first = int(cli("episode", "add", "queue backed up after the deploy").stdout)
    down = make_conninfo(db_url, host=tempfile.gettempdir() + "/memctl-no-such-replica")
    found = cli(
        "episode", "search", "queue deploy", "-f", "json", env={"MEMCTL_READ_DATABASE_URL": down}
    )
    assert [h["id"] for h in found.json()] == [first]
    assert "read replica (env MEMCTL_READ_DATABASE_URL): database unavailable" in found.stderr
    assert "reading from the primary" in found.stderr
    # a database without memctl's schema stands for a replica that has not replayed a migration: never migrated
    behind = cli("fact", "list", "-f", "json", env={"MEMCTL_READ_DATABASE_URL": empty_db_url})
    assert behind.exit_code == 0, behind.stderr
    assert "read replica (env MEMCTL_READ_DATABASE_URL): schema is behind" in behind.stderr
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute("SELECT to_regclass('memctl_migrations')").fetchone()[0] is None


def test_read_url_is_a_setting_masked_in_config_show(cli, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(
        '[database]\nread_url = "postgresql://memctl:s3cret-pw@replica.example/memctl"\n'
    )
    shown = {
        r["setting"]: r
        for r in cli("config", "show", "-f", "json", env={"MEMCTL_CONFIG": str(config)}).json()
    }
    assert shown["database.read_url"]["value"] == "postgresql://memctl:****@replica.example/memctl"
    assert shown["database.read_url"]["origin"] == "file"
    env = {
        "MEMCTL_CONFIG": str(config),
        "MEMCTL_READ_DATABASE_URL": "postgresql://other:pw2@replica2/memctl",
    }
    shown = cli("config", "show", "-f", "json", env=env)
    assert "pw2" not in shown.stdout and "s3cret" not in shown.stdout
    assert {r["setting"]: r["origin"] for r in shown.json()}[
        "database.read_url"
    ] == "env MEMCTL_READ_DATABASE_URL"


def _episode_rows(outcome) -> int:
    assert outcome.exit_code == 0, outcome.stderr
    return next(
        r["rows"]
        for r in outcome.json()
        if r["kind"] == "table" and r["relation"].split(".")[-1] == "episodes"
    )


def test_size_reads_the_standby(cli, db_url, pg_server, standby):
    for text in ("first outage", "second outage"):
        assert cli("episode", "add", text).exit_code == 0
    _replayed(pg_server, standby)
    read = {"MEMCTL_READ_DATABASE_URL": standby.url(db_url)}
    _pause(standby, pg_server, True)
    try:
        assert cli("episode", "add", "third outage").exit_code == 0
        assert _episode_rows(cli("size", "-s", "relations", "-f", "json", "--exact", env=read)) == 2
        assert _episode_rows(cli("size", "-s", "relations", "-f", "json", "--exact")) == 3
    finally:
        _pause(standby, pg_server, False)
