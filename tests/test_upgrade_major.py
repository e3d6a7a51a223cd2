"""The embedded server's PostgreSQL major moves only through `memctl db upgrade` (DESIGN.md decision 15).

A data directory another major wrote is refused at start, naming both majors and the way out (runs wherever the
embedded server does). `memctl db upgrade --old-bindir DIR` moves a real data directory written by Debian's
PostgreSQL 15 and holding a memory to the wheel's major with pg_upgrade, a verified backup first and the old directory
kept; and a memory goes from PostgreSQL 15 to the embedded server through `memctl backup` and `memctl restore` (the
way without the old programs). Those two need PostgreSQL 15: they run in CI step 3, whose lane installs it
(tests/ci/own-postgres.sh) and whose server is PostgreSQL 15; there a missing /usr/lib/postgresql/15/bin fails them.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest

from memctl import db
from memctl.db import embedded
from tests.fix_upgrade import table_rows


@pytest.fixture
def private_home():
    """A MEMCTL_HOME of this test under /tmp (the server's user must reach it), removed with its server."""
    base = Path(tempfile.mkdtemp(prefix="memctl-major-", dir="/tmp"))
    base.chmod(0o755)
    home = base / "home"
    home.mkdir()
    home.chmod(0o755)
    config = base / "config.toml"
    config.touch()
    env = {
        "MEMCTL_HOME": str(home),
        "MEMCTL_CONFIG": str(config),
        "MEMCTL_EMBEDDER": "hash",
        "MEMCTL_EMBED_MODEL": "hash-embed",
    }
    yield home, env
    beside = Path(sys.executable).parent / "memctl"
    subprocess.run(
        [str(beside) if beside.exists() else shutil.which("memctl"), "db", "stop"],
        env={**os.environ, **env},
        capture_output=True,
        timeout=60,
    )
    shutil.rmtree(base, ignore_errors=True)


def test_a_data_directory_of_another_major_is_refused_naming_both_and_the_way_out(
    private_home, memctl_bin
):
    home, env = private_home
    (home / "pgdata").mkdir(mode=0o700)
    (home / "pgdata" / "PG_VERSION").write_text("15\n")
    wheel = embedded.server_major()
    out = memctl_bin("fact", "get", "db.host", env=env)
    assert out.exit_code == 1 and "Traceback" not in out.stderr
    for needle in (
        "PostgreSQL 15",
        f"PostgreSQL {wheel}",
        "memctl db upgrade --old-bindir",
        "/usr/lib/postgresql/15/bin",
    ):
        assert needle in out.stderr, out.stderr
    assert "did not start" not in out.stderr


def _step_three(pg_role) -> Path:
    """PostgreSQL 15's programs (CI step 3); a skip, saying why, on a server of the wheel's major."""
    major = pg_role.server_version // 10000
    if major >= embedded.server_major():
        pytest.skip(
            f"moves a memory from an older PostgreSQL major: runs in CI step 3, against Debian's PostgreSQL 15 "
            f"(tests/ci/own-postgres.sh); this server is PostgreSQL {major}"
        )
    bindir = Path(f"/usr/lib/postgresql/{major}/bin")
    assert (bindir / "initdb").is_file(), (
        f"{bindir}: PostgreSQL {major}'s programs are missing here"
    )
    assert Path(f"/usr/lib/postgresql/{major}/lib/vector.so").is_file(), (
        "pgvector is not built for it"
    )
    return bindir


def _data_owner() -> pwd.struct_passwd:
    """Who runs the embedded server: as root the wheel's system user (made as the wheel makes it), else me."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid())
    try:
        return pwd.getpwnam(embedded.SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "-s", "/bin/bash", embedded.SYSTEM_USER], check=True)
        return pwd.getpwnam(embedded.SYSTEM_USER)


def _as(owner: pwd.struct_passwd) -> dict:
    return {"user": owner.pw_uid, "group": owner.pw_gid} if os.geteuid() == 0 else {}


def _writes(memctl_bin, env: dict) -> None:
    for args in (
        ("db", "migrate"),
        ("fact", "set", "db.host", "10.0.0.1"),
        ("fact", "set", "db.host", "10.0.0.2"),
        (
            "episode",
            "add",
            "Deploy of api v2.3 failed at 03:12: /var was full",
            "--source",
            "pager",
        ),
        ("episode", "add", "Redis evicted keys under memory pressure", "--agent", "ops"),
        ("embed",),
    ):
        out = memctl_bin(*args, env=env)
        assert out.exit_code == 0, (args, out.stderr)


def test_db_upgrade_moves_a_postgresql_15_data_directory(
    pg_server, pg_role, private_home, memctl_bin
):
    bindir = _step_three(pg_role)
    home, env = private_home
    owner = _data_owner()
    pgdata, sock = home / "pgdata", home.parent / "sock"
    for path in (pgdata, sock):
        path.mkdir(mode=0o700)
        os.chown(path, owner.pw_uid, owner.pw_gid) if os.geteuid() == 0 else None
    subprocess.run(
        [
            bindir / "initdb",
            "-D",
            pgdata,
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
        ],
        check=True,
        capture_output=True,
        **_as(owner),
    )
    ctl = [bindir / "pg_ctl", "-D", pgdata, "-w", "-l", sock / "log"]
    subprocess.run(
        [*ctl, "-o", f"-c listen_addresses='' -k {sock} -p 5499", "start"],
        check=True,
        capture_output=True,
        **_as(owner),
    )
    url = f"postgresql://postgres@/memctl?host={sock}&port=5499"
    try:
        with psycopg.connect(url.replace("/memctl?", "/postgres?"), autocommit=True) as admin:
            admin.execute("CREATE DATABASE memctl")
        _writes(memctl_bin, {**env, "MEMCTL_DATABASE_URL": url})
        with db.connect(url) as conn:
            before = table_rows(conn)
    finally:
        subprocess.run([*ctl, "-m", "fast", "stop"], check=True, capture_output=True, **_as(owner))
    refused = memctl_bin("fact", "get", "db.host", env=env)
    assert refused.exit_code == 1 and "memctl db upgrade" in refused.stderr
    moved = memctl_bin(
        "db", "upgrade", "--old-bindir", str(bindir), "-f", "json", env=env, timeout=600
    )
    assert moved.exit_code == 0, moved.stderr
    done = moved.json()
    kept = Path(done["old_directory_kept"])
    assert (kept / "PG_VERSION").read_text().strip() == str(pg_role.server_version // 10000)
    assert (pgdata / "PG_VERSION").read_text().strip() == str(embedded.server_major())
    assert Path(done["backup"]).parent == home / "backups" and Path(done["backup"]).is_file()
    assert memctl_bin("fact", "get", "db.host", env=env).stdout.strip() == "10.0.0.2"
    with db.connect(memctl_bin("db", "url", env=env).stdout.strip()) as conn:
        assert table_rows(conn) == before
    found = memctl_bin(
        "episode", "search", "why did the deploy fail", "--mode", "vector", "-f", "json", env=env
    )
    assert found.exit_code == 0 and found.json(), found.stderr


def test_a_backup_restored_moves_a_memory_to_the_embedded_major(
    pg_server, pg_role, db_url, private_home, memctl_bin, tmp_path
):
    """The way without the old major's programs: `memctl backup` there, `memctl restore` into a new data directory."""
    _step_three(pg_role)
    home, env = private_home
    _writes(memctl_bin, {**env, "MEMCTL_DATABASE_URL": db_url})
    with db.connect(db_url) as conn:
        before = table_rows(conn)
    taken = memctl_bin(
        "backup", "--to", str(tmp_path), "-f", "json", env={**env, "MEMCTL_DATABASE_URL": db_url}
    )
    assert taken.exit_code == 0, taken.stderr
    restored = memctl_bin("restore", taken.json()["file"], "--yes", env=env, timeout=300)
    assert restored.exit_code == 0, restored.stderr
    with db.connect(memctl_bin("db", "url", env=env).stdout.strip()) as conn:
        after = table_rows(conn)
    assert {t: rows for t, rows in after.items() if t != "jobs"} == {
        t: r for t, r in before.items() if t != "jobs"
    }
    assert memctl_bin("fact", "get", "db.host", env=env).stdout.strip() == "10.0.0.2"
