"""`memctl db migrate` on a memory an earlier memctl made: a verified backup first, in MEMCTL_HOME/backups, named on
stderr; no backup, no migration (unless --no-backup); facts, history and episodes as they were; nothing waits for
vectors; a paraphrase finds its episode in every mode. No other command migrates a memory silently."""

from __future__ import annotations

import pytest

from memctl import db
from memctl.backup import backup_file
from memctl.db import migrate
from memctl.upgrade import migrating
from memctl.errors import SchemaBehind
from tests.fix_upgrade import fixture_records, table_rows

BY_NAME = {r["name"]: r for r in fixture_records()}
TWO = [
    "8bac5e3",
    "3ef5ae8",
]  # two earlier commits of main: before repeats and agents, and main just before 0.2.0
PARAPHRASE = ("nginx logs filled /var and broke the deploy", 2)  # (query, the episode it means)
READ = {
    "facts": ["namespace", "key", "value", "version", "updated_at", "source"],  # as SQL reads them
    "fact_history": [
        "id",
        "namespace",
        "key",
        "version",
        "op",
        "old_value",
        "new_value",
        "changed_at",
    ],
    "episodes": ["id", "agent", "kind", "content", "source", "importance", "created_at", "meta"],
}


@pytest.fixture
def fixture_models(ollama):
    """The fixtures' models on the Ollama-protocol test server, computing what they computed at build time."""
    from memctl.embedding.embedders import HashEmbedder

    for name, dims in BY_NAME[TWO[-1]]["models"].items():
        embedder = HashEmbedder(name, dims)
        ollama.add_model(name, dims, 512, lambda texts, e=embedder: e.embed(texts).vectors)
    return ollama


def _env(url, tmp_path, ollama) -> dict:
    return {
        "MEMCTL_DATABASE_URL": url,
        "MEMCTL_HOME": str(tmp_path / "home"),
        "MEMCTL_EMBEDDER": "ollama",
        "MEMCTL_EMBED_MODEL": "fixture-a",
        "OLLAMA_HOST": ollama.url,
    }


@pytest.mark.parametrize("name", TWO)
def test_db_migrate_backs_up_first_and_keeps_every_memory(
    name, restored, memctl_bin, memctl_env, fixture_models, tmp_path
):
    record = BY_NAME[name]
    url = restored(record)
    env = {**memctl_env, **_env(url, tmp_path, fixture_models)}
    with db.connect(url) as conn:
        before = table_rows(conn, READ)
    refused = memctl_bin("fact", "get", "db.host", env=env)
    assert refused.exit_code == 1 and "memctl db migrate" in refused.stderr  # no silent migration
    done = memctl_bin("db", "migrate", env=env)
    assert done.exit_code == 0, done.stderr
    backups = list((tmp_path / "home" / "backups").glob("memctl-before-migrate-*.tar"))
    assert len(backups) == 1 and str(backups[0]) in done.stderr and "verified" in done.stderr
    manifest = backup_file.read_manifest(backups[0])
    assert manifest["migration"] == record["sql"][-1]  # taken before the first migration ran
    with db.connect(url) as conn:
        assert table_rows(conn, READ) == before
        assert (
            conn.execute("SELECT count(*) AS n FROM embed_queue").fetchone()["n"] == 0
        )  # nothing waits for vectors
    for mode in ("vector", "text", "hybrid"):
        found = memctl_bin(
            "episode", "search", PARAPHRASE[0], "--mode", mode, "-k", "3", "-f", "json", env=env
        )
        assert found.exit_code == 0 and PARAPHRASE[1] in [r["id"] for r in found.json()], (
            mode,
            found.stdout,
        )
    again = memctl_bin("db", "migrate", env=env)
    assert again.exit_code == 0 and "up to date" in again.stderr
    assert (
        len(list((tmp_path / "home" / "backups").glob("*.tar"))) == 1
    )  # nothing to migrate, no backup


def test_no_backup_no_migration(restored, cli, tmp_path):
    url = restored(BY_NAME["3ef5ae8"])
    home = tmp_path / "home"
    home.mkdir()
    (home / "backups").write_text("a file where the backup directory should be")
    env = {"MEMCTL_DATABASE_URL": url, "MEMCTL_HOME": str(home)}
    stopped = cli("db", "migrate", env=env)
    assert (
        stopped.exit_code == 1
        and "nothing was migrated" in stopped.stderr
        and "--no-backup" in stopped.stderr
    )
    with db.connect(url) as conn:
        assert migrate.pending(conn)
    done = cli("db", "migrate", "--no-backup", env=env)
    assert done.exit_code == 0 and "no backup taken" in done.stderr
    with db.connect(url) as conn:
        assert migrate.pending(conn) == []


def test_only_a_memory_without_rows_is_migrated_on_first_use(restored, empty_db_url):
    """The embedded server's first use still creates its schema; a memory is never migrated by the way."""
    with db.connect(empty_db_url) as conn:
        migrate.ensure_current(conn, auto=True)
        assert migrate.pending(conn) == []
    with db.connect(restored(BY_NAME["3ef5ae8"])) as conn:
        with pytest.raises(SchemaBehind, match="memctl db migrate"):
            migrate.ensure_current(conn, auto=True)
        assert migrate.pending(conn)


def test_an_edited_migration_without_its_fix_up_is_refused_as_before(restored, tmp_path):
    """What a memory made between the edits met before the fix-ups: the fix-ups are what lets it through."""
    import shutil

    bare = tmp_path / "sql"
    shutil.copytree(migrate.sql_dir(), bare, ignore=shutil.ignore_patterns("fixups"))
    with db.connect(restored(BY_NAME["df4f8cc"])) as conn:
        with pytest.raises(Exception, match="changed since they ran: 0019_agents.sql"):
            migrate.apply(conn, bare)
        applied = migrating.apply(conn)  # with the erasure key sql/0024 rekeys lineage under
        assert [m.name for m in applied if m.fixup] == ["0019_agents.sql"]
        row = conn.execute(
            "SELECT checksum, fixed_from FROM memctl_migrations WHERE name = '0019_agents.sql'"
        ).fetchone()
        assert row["checksum"] == next(
            m.checksum for m in migrate.read_files() if m.name == "0019_agents.sql"
        )
        assert row["fixed_from"].startswith("86396aea")


@pytest.mark.superuser("it plays an older pgvector by rewriting pg_extension's version")
def test_a_pgvector_older_than_the_servers_is_named_and_updated_by_migrate(db_url, cli):
    import psycopg

    from memctl.db import preflight

    with db.connect(db_url) as conn:
        available = ".".join(map(str, preflight.available_pgvector(conn)["version"]))
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE pg_extension SET extversion = '0.8.5' WHERE extname = 'vector'")
    status = cli("status", "-f", "json")
    assert (
        "pgvector 0.8.5 is created in this database, and the server has " + available
        in status.stdout + status.stderr
    )
    done = cli("db", "migrate")
    assert done.exit_code == 0 and f"0.8.5 -> {available}" in done.stderr
    with db.connect(db_url) as conn:
        assert preflight.pgvector_behind(conn) is None
