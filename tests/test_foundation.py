"""The skeleton: version and help, configuration, migrations, the embedded server's commands."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from memctl import __version__, config, db
from memctl.db import embedded, migrate
from memctl.errors import ConfigError, MemctlError


def test_version_and_help(memctl_bin):
    version = memctl_bin("--version")
    lines = version.stdout.splitlines()
    assert version.exit_code == 0 and lines[0] == f"memctl {__version__}"
    assert lines[1].startswith(f"schema {migrate.read_files()[-1].name} ")  # the schema it carries
    helped = memctl_bin("--help")
    for noun in ("fact", "episode", "embed", "status", "db", "config"):
        assert noun in helped.stdout
    assert memctl_bin("fact", "--help").exit_code == 0
    assert memctl_bin("no-such-command").exit_code == 2


def test_config_reports_every_problem_at_once(tmp_path, cli):
    path = tmp_path / "bad.toml"
    path.write_text(
        'colour = "red"\n[embedding]\nbatch_size = -3\nflavour = "x"\n[retention]\nraw = "30 parsecs"\n'
        "[importance]\nconversation = 11\n"
    )
    with pytest.raises(ConfigError) as caught:
        config.load(path, environ={})
    message = str(caught.value)
    for needle in ("colour", "batch_size", "flavour", "raw", "conversation", str(path)):
        assert needle in message
    assert "5 problem(s)" in message
    result = cli("config", "show", env={"MEMCTL_CONFIG": str(path)})
    assert result.exit_code == 1 and "flavour" in result.stderr and "Traceback" not in result.stderr


def test_config_precedence_and_show(tmp_path, cli, memctl_env):
    path = Path(memctl_env["MEMCTL_CONFIG"])
    path.write_text('[embedding]\nmodel = "from-file"\nbatch_size = 8\n')
    shown = {r["setting"]: r for r in cli("config", "show", "-f", "json").json()}
    assert (
        shown["embedding.batch_size"]["value"] == 8
        and shown["embedding.batch_size"]["origin"] == "file"
    )
    assert shown["embedding.model"]["origin"] == "env MEMCTL_EMBED_MODEL"  # env beats the file
    assert shown["embedding.timeout"]["origin"] == "default"
    assert cli("config", "path").stdout.strip() == str(path)


def test_migrate_refuses_an_edited_applied_file(empty_db_url, tmp_path):
    files = tmp_path / "sql"
    files.mkdir()
    (files / "0001_a.sql").write_text("CREATE TABLE t_a (x int);")
    with db.connect(empty_db_url) as conn:
        assert [m.name for m in migrate.apply(conn, files)] == ["0001_a.sql"]
        (files / "0002_b.sql").write_text("CREATE TABLE t_b (x int);")
        assert [m.status for m in migrate.plan(conn, files)] == ["applied", "pending"]
        (files / "0001_a.sql").write_text("CREATE TABLE t_a (x bigint);")
        with pytest.raises(MemctlError, match="changed since they ran: 0001_a.sql"):
            migrate.apply(conn, files)
        assert conn.execute("SELECT to_regclass('t_b') AS r").fetchone()["r"] is None


def test_a_failing_migration_leaves_nothing_behind(empty_db_url, tmp_path):
    files = tmp_path / "sql"
    files.mkdir()
    (files / "0001_ok.sql").write_text("CREATE TABLE t_ok (x int);")
    (files / "0002_bad.sql").write_text("CREATE TABLE t_half (x int); SELECT 1/0;")
    with db.connect(empty_db_url) as conn:
        with pytest.raises(Exception):
            migrate.apply(conn, files)
        assert conn.execute("SELECT to_regclass('t_half') AS r").fetchone()["r"] is None
        assert [m.status for m in migrate.plan(conn, files)] == ["applied", "pending"]


def test_two_processes_migrating_at_once_apply_each_file_once(empty_db_url):
    errors = []

    def run():
        try:
            with db.connect(empty_db_url) as conn:
                migrate.apply(conn)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with db.connect(empty_db_url) as conn:
        rows = conn.execute(
            "SELECT name, count(*) AS n FROM memctl_migrations GROUP BY name"
        ).fetchall()
        assert {r["n"] for r in rows} == {1} and len(rows) == len(migrate.read_files())


def test_sql_files_ship_inside_the_wheel(tmp_path):
    out = subprocess.run(
        [
            "python",
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(Path(__file__).parents[1]),
        ],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:  # no hatchling in this environment: build with isolation
        out = subprocess.run(
            [
                "python",
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "-w",
                str(tmp_path),
                str(Path(__file__).parents[1]),
            ],
            capture_output=True,
            text=True,
        )
    assert out.returncode == 0, out.stderr[-2000:]
    import zipfile

    wheel = next(tmp_path.glob("memctl-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "memctl/sql/0001_facts.sql" in names and "memctl/sql/templates/vectors.sql" in names
    assert any(n.startswith("memctl/systemd_units/") for n in names)


@pytest.fixture
def own_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("MEMCTL_HOME", str(home))
    monkeypatch.delenv("MEMCTL_DATABASE_URL", raising=False)
    (tmp_path / "none.toml").touch()  # a file MEMCTL_CONFIG names must exist
    monkeypatch.setenv("MEMCTL_CONFIG", str(tmp_path / "none.toml"))
    yield home
    embedded.stop()


def test_embedded_server_lifecycle_and_psql(own_home, memctl_bin):
    env = {
        "MEMCTL_HOME": str(own_home),
        "MEMCTL_CONFIG": os.environ["MEMCTL_CONFIG"],
        "MEMCTL_DATABASE_URL": "",
    }
    assert (
        memctl_bin("fact", "set", "db.port", "5432", env=env).exit_code == 0
    )  # starts and migrates on first use
    status = memctl_bin("db", "status", "-f", "json", env=env).json()
    assert status["embedded_running"] is True and status["embedded_data"] == str(
        own_home / "pgdata"
    )
    url = memctl_bin("db", "url", env=env).stdout.strip()
    psql = shutil.which("psql") or str(embedded.bin_dir() / "psql")
    out = subprocess.run(
        [psql, url, "-Atc", "SELECT value FROM facts WHERE key = 'db.port'"],
        capture_output=True,
        text=True,
    )
    assert out.stdout.strip() == "5432", out.stderr
    # the new server got a quarter of the memory, not PostgreSQL's 128 MB, and kept it across the restart
    out = subprocess.run(
        [
            psql,
            url,
            "-Atc",
            "SELECT setting::int * 8 / 1024, source FROM pg_settings WHERE name = 'shared_buffers'",
        ],
        capture_output=True,
        text=True,
    )
    assert out.stdout.strip() == f"{embedded.shared_buffers_mb()}|configuration file", out.stderr
    assert (
        embedded.shared_buffers_mb() > 128
        or os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") < 2**31
    )
    assert memctl_bin("db", "stop", env=env).exit_code == 0
    assert memctl_bin("db", "status", "-f", "json", env=env).json()["embedded_running"] is False
    assert (
        memctl_bin("fact", "get", "db.port", env=env).stdout == "5432\n"
    )  # started again, data kept


def test_root_refuses_a_home_directory_for_embedded_data(monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("only root is refused")
    monkeypatch.setenv("MEMCTL_HOME", "/root/memctl-data")
    with pytest.raises(ConfigError, match="home directory"):
        embedded.memctl_home()
    monkeypatch.delenv("MEMCTL_HOME")
    assert embedded.memctl_home() == Path("/var/lib/memctl")


def test_database_down_is_exit_3_without_traceback(cli):
    result = cli(
        "fact", "get", "x", env={"MEMCTL_DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none"}
    )
    assert (
        result.exit_code == 3
        and "database unavailable" in result.stderr
        and "Traceback" not in result.stderr
    )


@pytest.mark.parametrize("fmt", ["table", "json", "jsonl", "csv"])
def test_config_show_masks_every_credential_in_every_format(cli, memctl_env, fmt):
    Path(memctl_env["MEMCTL_CONFIG"]).write_text(
        '[embedding]\nmodel = "m"\n[recall]\ntemplate = "https://127.0.0.1/t?password=qs3cret&x=1"\n'
    )
    env = {
        "OLLAMA_HOST": "http://ollama:oll4ma-pw@127.0.0.1:11434",
        "MEMCTL_DATABASE_URL": "postgresql://memctl:db-pw-1@127.0.0.1:1/memctl?sslpassword=ssl-pw-2&sslmode=require",
    }
    shown = cli("config", "show", "-f", fmt, env=env)
    assert shown.exit_code == 0, shown.stderr
    for secret in ("oll4ma-pw", "db-pw-1", "ssl-pw-2", "qs3cret"):
        assert secret not in shown.stdout + shown.stderr
    for kept in (
        "http://ollama:****@127.0.0.1:11434",
        "postgresql://memctl:****@127.0.0.1:1/memctl",
        "sslmode=require",
        "password=****&x=1",
    ):
        assert kept in shown.stdout  # masked, not dropped: the rest stays readable


def test_config_show_masks_a_bare_ollama_host_with_credentials(cli):
    shown = cli(
        "config", "show", "-f", "csv", env={"OLLAMA_HOST": "ollama:b4re-pw@127.0.0.1:11434"}
    )
    assert shown.exit_code == 0 and "b4re-pw" not in shown.stdout + shown.stderr
    assert "embedding.ollama_host,ollama:****@127.0.0.1:11434,env OLLAMA_HOST" in shown.stdout


def test_config_show_masks_a_key_value_database_url(cli, memctl_env):
    Path(memctl_env["MEMCTL_CONFIG"]).write_text(
        "database_url = \"host=127.0.0.1 password='kv s3cret' dbname=memctl\"\n"
    )
    shown = cli("config", "show", "-f", "json", env={"MEMCTL_DATABASE_URL": ""})
    assert shown.exit_code == 0, shown.stderr
    [row] = [r for r in shown.json() if r["setting"] == "database_url"]
    assert row == {
        "setting": "database_url",
        "value": "host=127.0.0.1 password=**** dbname=memctl",
        "origin": "file",
    }


@pytest.mark.parametrize(
    "text, masked",
    [
        (
            "postgresql://u:pw@h/db and http://u:pw@h:1",
            "postgresql://u:****@h/db and http://u:****@h:1",
        ),
        ("postgresql://u:p@s/s@h/db", "postgresql://u:****@h/db"),
        ("postgresql://:pw@h/db", "postgresql://:****@h/db"),
        ("host=h password=pw port=5", "host=h password=**** port=5"),
        ("host=h PASSWORD = 'a b\\' c' port=5", "host=h PASSWORD = **** port=5"),
        (
            "postgresql://h/db?user=u&password=pw&sslmode=require",
            "postgresql://h/db?user=u&password=****&sslmode=require",
        ),
        ("http://h:1/?token=t#f", "http://h:1/?token=****#f"),
        ("postgresql://u@h/db?sslmode=require", "postgresql://u@h/db?sslmode=require"),
        (
            'password authentication failed for user "u"',
            'password authentication failed for user "u"',
        ),
    ],
)
def test_mask_secrets(text, masked):
    assert config.mask_secrets(text) == masked
