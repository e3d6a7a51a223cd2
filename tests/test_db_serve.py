"""`memctl db serve`: one owner for the embedded server, as memctl-db.service runs it (without systemd as PID 1).

Each test has its own MEMCTL_HOME under /tmp and runs the installed memctl in subprocesses. PostgreSQL
refuses root: run as root, these tests create a system user to own the home (serve then runs the server
as that user, as the unit's User= would) and, for the socket's group, a member and a non-member.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

from memctl.db import embedded

READY = "database system is ready to accept connections"
IS_ROOT = os.geteuid() == 0
SERVER_USER, MEMBER, OUTSIDER = "memctl_tsrv", "memctl_tmember", "memctl_toutsider"
WAIT_S = 120  # a bound on waiting for a server, never an assertion on speed


def _memctl() -> str:
    beside = Path(sys.executable).parent / "memctl"
    exe = str(beside) if beside.exists() else shutil.which("memctl")
    assert exe, "no memctl installed beside this Python or on PATH"
    return exe


def _ensure_user(name: str, group: str | None = None) -> pwd.struct_passwd:
    """A system user (created once, kept: users are global and other runs may be using it)."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--user-group",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(name)
    if group and name not in grp.getgrnam(group).gr_mem:
        subprocess.run(["usermod", "-aG", group, name], check=True, capture_output=True)
    return entry


@contextlib.contextmanager
def _new_home(pgdata: Path | None = None):
    """(env, home): a MEMCTL_HOME, 0750 like the units' state directory, owned by the server's user;
    empty, or holding a copy of `pgdata` (ownership kept)."""
    path = Path(tempfile.mkdtemp(prefix="memctl-test-serve-"))
    if IS_ROOT:
        owner = _ensure_user(SERVER_USER)
        os.chown(path, owner.pw_uid, owner.pw_gid)
    path.chmod(0o750)
    if pgdata is not None:
        subprocess.run(["cp", "-a", str(pgdata), str(path / "pgdata")], check=True)
    config = path.parent / f"{path.name}.toml"
    config.write_text("")
    env = {
        **os.environ,
        "MEMCTL_HOME": str(path),
        "MEMCTL_CONFIG": str(config),
        "MEMCTL_DATABASE_URL": "",
        "MEMCTL_EMBEDDER": "hash",
    }
    try:
        yield env, path
    finally:
        _stop_any(path)
        shutil.rmtree(path, ignore_errors=True)
        config.unlink(missing_ok=True)
        Path(f"{path}.log").unlink(missing_ok=True)


@pytest.fixture(scope="session")
def template_pgdata():
    """A data directory `memctl db serve` made (initdb, memctl's database) and shut down cleanly: copied
    into the homes of the tests that do not test making one (initdb is the slow part of a first start)."""
    with _new_home() as (env, path):
        Server(env, path).stop()
        keep = Path(tempfile.mkdtemp(prefix="memctl-test-serve-template-"))
        subprocess.run(["cp", "-a", str(path / "pgdata"), str(keep / "pgdata")], check=True)
    try:
        yield keep / "pgdata"
    finally:
        shutil.rmtree(keep, ignore_errors=True)


@pytest.fixture
def home(template_pgdata):
    with _new_home(template_pgdata) as made:
        yield made


@pytest.fixture
def empty_home():
    with _new_home() as made:
        yield made


def _stop_any(path: Path) -> None:
    """Whatever server is left on this home (a failed test's), stopped by its pid."""
    try:
        pid = int((path / "pgdata" / "postmaster.pid").read_text().splitlines()[0])
        os.kill(pid, signal.SIGQUIT)
    except (OSError, ValueError, IndexError):
        pass


class Server:
    """A `memctl db serve` subprocess, its stderr in HOME.log."""

    def __init__(self, env: dict, home: Path):
        self.env, self.home = env, home
        self.log_path = Path(f"{home}.log")
        self.offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                [_memctl(), "db", "serve"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + WAIT_S
        while "memctl: embedded database ready" not in self.log():
            assert self.proc.poll() is None, self.log()
            assert time.monotonic() < deadline, self.log()
            time.sleep(0.05)

    def log(self) -> str:
        """This run's part of the log."""
        return self.log_path.read_text()[self.offset :]

    @property
    def url(self) -> str:
        marker = json.loads((self.home / embedded.MANAGED).read_text())
        return f"postgresql://postgres@/{embedded.DATABASE}?host={marker['socket_dir']}&port={marker['port']}"

    def postmaster_pid(self) -> int:
        return int((self.home / "pgdata" / "postmaster.pid").read_text().splitlines()[0])

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=WAIT_S)


@pytest.fixture
def server(home):
    env, path = home
    served = Server(env, path)
    try:
        yield served
    finally:
        if served.proc.poll() is None:
            served.stop()


def _run(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [_memctl(), *args], env=env, capture_output=True, text=True, timeout=WAIT_S
    )


def test_serve_makes_the_data_directory_and_the_database_on_an_empty_home(empty_home):
    env, path = empty_home
    served = Server(env, path)
    try:
        assert (path / "pgdata" / "PG_VERSION").exists()
        conf = (path / "pgdata" / "postgresql.auto.conf").read_text()
        assert conf.count("shared_buffers") == 1  # sized as an on-demand start sizes it
        with psycopg.connect(served.url, autocommit=True) as client:
            assert client.execute("SELECT current_database()").fetchone() == (embedded.DATABASE,)
        marker = json.loads((path / embedded.MANAGED).read_text())
        assert marker == {
            "unit": "memctl-db.service",
            "socket_dir": str(path / "run"),
            "port": 5432,
        }
        assert (path / embedded.MANAGED).stat().st_mode & 0o777 == 0o644
        assert (path / "pgdata").stat().st_uid == (
            path.stat().st_uid
        )  # the server's user, never root
    finally:
        assert served.stop() == 0


def test_jobs_and_a_long_lived_client_share_the_one_server(server):
    with psycopg.connect(
        server.url, autocommit=True
    ) as client:  # the database exists before any job ran
        added = _run(server.env, "episode", "add", "disk full on web-1; rotating logs fixed it")
        assert added.returncode == 0, added.stderr
        embedded_rows = _run(server.env, "embed", "-f", "json")
        assert embedded_rows.returncode == 0, embedded_rows.stderr
        assert sum(row["embedded"] for row in json.loads(embedded_rows.stdout)) == 1
        assert client.execute("SELECT count(*) FROM episodes").fetchone() == (1,)
        status = json.loads(_run(server.env, "db", "status", "-f", "json").stdout)
        assert (
            status["embedded_managed_by"] == "memctl-db.service"
            and status["embedded_running"] is True
        )
    assert server.log().count(READY) == 1  # one server, the served one
    assert not (
        server.home / "pgdata" / "log"
    ).exists()  # the on-demand start path (it logs there) never ran
    assert server.proc.poll() is None


def test_a_job_killed_with_its_process_group_leaves_the_server_and_its_clients(server):
    pid = server.postmaster_pid()
    with psycopg.connect(server.url, autocommit=True) as client:
        job = subprocess.Popen(
            [_memctl(), "embed", "--loop", "--interval", "1"],
            env=server.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + WAIT_S
        while not client.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'memctl'"
        ).fetchone()[0]:
            assert job.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        os.killpg(
            job.pid, signal.SIGKILL
        )  # what systemd does to a oneshot unit's processes, at its harshest
        assert job.wait(timeout=WAIT_S) == -signal.SIGKILL
        assert client.execute("SELECT 1").fetchone() == (1,)  # same connection, still served
    assert server.proc.poll() is None and server.postmaster_pid() == pid
    assert "terminated by signal" not in server.log() and "crash" not in server.log()
    after = _run(server.env, "episode", "add", "still here")
    assert after.returncode == 0, after.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_is_a_fast_clean_shutdown_even_with_a_client_connected(home, sig):
    env, path = home
    served = Server(env, path)
    client = psycopg.connect(
        served.url, autocommit=True
    )  # a smart shutdown would wait for it forever
    try:
        assert served.stop(sig) == 0
    finally:
        client.close()
    log = served.log()
    assert "received fast shutdown request" in log and "database system is shut down" in log, log
    marker = json.loads((path / embedded.MANAGED).read_text())
    assert not (Path(marker["socket_dir"]) / ".s.PGSQL.5432").exists()

    again = Server(env, path)
    try:
        log = again.log()
        assert "database system was shut down at" in log and "recovery" not in log, log
    finally:
        assert again.stop() == 0


def test_a_managed_home_never_gets_a_server_of_a_command(home):
    env, path = home
    served = Server(env, path)
    refused = _run(env, "db", "stop")
    assert refused.returncode == 1 and "systemctl stop memctl-db.service" in refused.stderr
    assert served.proc.poll() is None
    assert served.stop() == 0

    for args in [("episode", "add", "nobody to store me"), ("db", "start"), ("db", "url")]:
        result = _run(env, *args)
        assert result.returncode == 3, (args, result.stderr)
        assert (
            "systemctl start memctl-db.service" in result.stderr
            and "Traceback" not in result.stderr
        )
    assert not (path / "pgdata" / "postmaster.pid").exists()  # no server started
    assert not (path / "pgdata" / "log").exists()
    assert _run(env, "db", "stop").returncode == 0  # nothing to stop


def test_serve_never_takes_over_a_server_it_did_not_start(empty_home):
    """A server started on demand (as root: a Quickstart's, running as embedded_postgres) is left alone."""
    env, path = empty_home
    started = _run(env, "db", "start")
    assert started.returncode == 0, started.stderr
    refused = _run(env, "db", "serve")
    assert refused.returncode == 1, refused.stderr
    expected = (
        "belongs to embedded_postgres" if IS_ROOT else "a server started outside memctl db serve"
    )
    assert expected in refused.stderr and "Traceback" not in refused.stderr
    assert not (path / embedded.MANAGED).exists()
    assert json.loads(_run(env, "db", "status", "-f", "json").stdout)["embedded_running"] is True
    assert _run(env, "db", "stop").returncode == 0


@pytest.mark.skipif(not IS_ROOT, reason="needs root to create a group member and a non-member")
def test_the_socket_admits_the_servers_group_and_nobody_else(server):
    member, outsider = _ensure_user(MEMBER, group=SERVER_USER), _ensure_user(OUTSIDER)
    marker = json.loads((server.home / embedded.MANAGED).read_text())
    psql = [
        str(embedded.bin_dir() / "psql"),
        "-h",
        marker["socket_dir"],
        "-p",
        str(marker["port"]),
        "-U",
        "postgres",
        "-d",
        embedded.DATABASE,
        "-Atc",
        "SELECT current_database()",
    ]

    def as_user(entry: pwd.struct_passwd, argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(
            argv,
            user=entry.pw_uid,
            group=entry.pw_gid,
            cwd="/",
            capture_output=True,
            text=True,
            extra_groups=os.getgrouplist(entry.pw_name, entry.pw_gid),
            timeout=WAIT_S,
        )

    joined = as_user(member, psql)
    assert (joined.returncode, joined.stdout) == (0, "memctl\n"), joined.stderr
    # The member reads the marker that names the socket, not the data directory.
    assert as_user(member, ["cat", str(server.home / embedded.MANAGED)]).returncode == 0
    assert as_user(member, ["cat", str(server.home / "pgdata" / "postmaster.pid")]).returncode != 0
    kept_out = as_user(outsider, psql)
    assert kept_out.returncode != 0 and "Permission denied" in kept_out.stderr


@pytest.mark.skipif(not IS_ROOT, reason="giving a data directory to another user needs root")
def test_serve_refuses_a_data_directory_of_another_user(empty_home):
    env, path = empty_home
    (path / "pgdata").mkdir()
    os.chown(path / "pgdata", 1234567, 1234567)
    refused = _run(env, "db", "serve")
    assert refused.returncode == 1 and "belongs to 1234567" in refused.stderr, refused.stderr
    assert (path / "pgdata").stat().st_uid == 1234567 and not (path / embedded.MANAGED).exists()


@pytest.mark.skipif(not IS_ROOT, reason="only root can be refused for being root")
def test_as_root_serve_refuses_a_home_root_owns():
    path = Path(tempfile.mkdtemp(prefix="memctl-test-serve-root-"))
    try:
        env = {
            **os.environ,
            "MEMCTL_HOME": str(path),
            "MEMCTL_CONFIG": os.devnull,
            "MEMCTL_DATABASE_URL": "",
        }
        refused = _run(env, "db", "serve")
        assert refused.returncode == 1 and "PostgreSQL refuses root" in refused.stderr, (
            refused.stderr
        )
        assert list(path.iterdir()) == []
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_serve_serves_on_when_a_newer_memctl_migrates_the_memory(server, tmp_path):
    """serve holds no schema: a migration this memctl does not know, applied while it runs, leaves it serving (the
    processes that hold a schema stop instead: tests/test_upgrade_running.py)."""
    from memctl import db
    from memctl.db import migrate

    newer = tmp_path / "newer-sql"
    shutil.copytree(migrate.sql_dir(), newer)
    (newer / "9000_future.sql").write_text("CREATE TABLE memctl_future_test (x int);\n")
    with db.connect(server.url) as conn:
        migrate.apply(conn, newer)
    with psycopg.connect(server.url, autocommit=True) as client:
        assert client.execute("SELECT max(name) FROM memctl_migrations").fetchone() == (
            "9000_future.sql",
        )
    assert server.proc.poll() is None
    assert server.stop() == 0
