"""The embedded server's first start, by several memctl processes at once (a VPS at boot).

Each test has its own empty MEMCTL_HOME from tempfile.mkdtemp (under /tmp, never a home
directory: as root the wheel opens every parent of the data directory to its system user),
runs the installed memctl, and stops its server at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from memctl.db import embedded

STARTERS = 4
READY = "database system is ready to accept connections"


def _memctl() -> str:
    beside = Path(sys.executable).parent / "memctl"
    exe = str(beside) if beside.exists() else shutil.which("memctl")
    assert exe, "no memctl installed beside this Python or on PATH"
    return exe


@pytest.fixture
def empty_home():
    """(env, home): an empty MEMCTL_HOME and an empty config; the server stopped and the home removed after."""
    home = Path(tempfile.mkdtemp(prefix="memctl-test-start-"))
    config = home.parent / f"{home.name}.toml"
    config.write_text("")
    env = {
        **os.environ,
        "MEMCTL_HOME": str(home),
        "MEMCTL_CONFIG": str(config),
        "MEMCTL_DATABASE_URL": "",
    }
    try:
        yield env, home
    finally:
        subprocess.run([_memctl(), "db", "stop"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(home, ignore_errors=True)
        config.unlink(missing_ok=True)


def _run(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([_memctl(), *args], env=env, capture_output=True, text=True, timeout=120)


def test_four_processes_on_an_empty_home_share_one_first_start(empty_home):
    env, home = empty_home
    procs = [
        subprocess.Popen(
            [_memctl(), "fact", "set", f"k{n}", f"v{n}"],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for n in range(STARTERS)
    ]
    for proc in procs:
        _out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0 and "Traceback" not in err, err

    listed = _run(env, "fact", "list", "-f", "json")
    assert listed.returncode == 0, listed.stderr
    assert {f["key"]: f["value"] for f in json.loads(listed.stdout)} == {
        f"k{n}": f"v{n}" for n in range(STARTERS)
    }

    pgdata = home / "pgdata"
    log = (pgdata / "log").read_text()
    assert log.count(READY) == 1, log  # one postmaster, started once: no second server, no restart
    assert "already exists" not in log and "shutting down" not in log, log
    conf = (pgdata / "postgresql.auto.conf").read_text()
    assert conf.count("shared_buffers") == 1, conf  # sized once
    lock = home / embedded.START_LOCK
    assert lock.stat().st_mode & 0o777 == 0o600 and lock.stat().st_uid == os.geteuid()

    url = _run(env, "db", "url").stdout.strip()
    with psycopg.connect(url) as conn:
        setting, source = conn.execute(
            "SELECT setting::bigint * 8 / 1024, source FROM pg_settings "
            "WHERE name = 'shared_buffers'"
        ).fetchone()
    assert (setting, source) == (embedded.shared_buffers_mb(), "configuration file")
    pid = (pgdata / "postmaster.pid").read_text().splitlines()[0]
    assert f"[{pid}]" in next(
        line for line in log.splitlines() if READY in line
    )  # the one running now


def test_a_server_found_running_without_its_database_is_waited_for(empty_home):
    """What a process sees when it reads postmaster.pid while another is still creating the database."""
    env, _home = empty_home
    started = _run(env, "db", "url")  # starts it, with its database
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip()
    admin = psycopg.conninfo.make_conninfo(url, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(embedded.DATABASE)))

    written = _run(env, "fact", "set", "k", "v")
    assert written.returncode == 0 and "Traceback" not in written.stderr, written.stderr
    assert _run(env, "fact", "get", "k").stdout == "v\n"
