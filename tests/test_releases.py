"""Releases: each one lists its schema files (sql/released.json), a released file never changes or disappears, the
changelog names the version memctl calls itself, and `memctl --version` says which schema it carries."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from memctl import __version__
from memctl.db import migrate
from tests import release_manifest

CHECKOUT = Path(__file__).resolve().parents[1]


def test_the_manifest_lists_every_schema_file_as_it_is():
    assert release_manifest.read() == release_manifest.generate(
        release_manifest.read(), __version__
    ), "sql/released.json is not up to date: python tests/release_manifest.py"
    listed = {name for r in release_manifest.read()["releases"] for name in r["files"]}
    assert {m.name for m in migrate.read_files(release_manifest.SQL)} <= listed


@pytest.mark.parametrize("change", ["edit", "remove"])
def test_a_released_file_that_changes_or_disappears_fails_the_manifest(tmp_path, change):
    sql = tmp_path / "sql"
    shutil.copytree(release_manifest.SQL, sql)
    released = release_manifest.generate(
        None, "0.1.9", sql
    )  # everything there now, as an earlier release
    target = sql / "0001_facts.sql"
    if change == "edit":
        target.write_text(target.read_text() + "\n-- one more line\n")
    else:
        target.unlink()
    with pytest.raises(release_manifest.ReleasedFileChanged, match="0001_facts.sql"):
        release_manifest.generate(released, "0.2.1", sql)
    (sql / "0099_next.sql").write_text("SELECT 1;\n")  # a new file joins the version being made
    if change == "edit":
        target.write_text(target.read_text().replace("\n-- one more line\n", ""))
        made = release_manifest.generate(released, "0.2.1", sql)
        assert made["releases"][-1] == {
            "version": "0.2.1",
            "files": {"0099_next.sql": release_manifest.files(sql)["0099_next.sql"]},
        }


def test_the_changelog_names_this_version_first():
    changelog = (CHECKOUT / "CHANGELOG.md").read_text(encoding="utf-8")
    versions = re.findall(r"^## (\d+\.\d+\.\d+)", changelog, re.MULTILINE)
    assert versions and versions[0] == __version__ and __version__ != "0.1.0"


def test_the_version_names_the_database_it_reaches(memctl_bin, memctl_env):
    """--version: memctl's version, its schema, and the database's schema, PostgreSQL and pgvector."""
    out = memctl_bin("--version", env=memctl_env)
    lines = out.stdout.splitlines()
    assert out.exit_code == 0 and lines[0] == f"memctl {__version__}"
    assert lines[1].startswith(f"schema {migrate.newest()} ")
    assert lines[2] == f"database schema {migrate.newest()}"
    assert re.fullmatch(r"PostgreSQL \d+\.\d+.*", lines[3]) and re.fullmatch(
        r"pgvector \d+\.\d+\.\d+.*", lines[4]
    )
    down = memctl_bin(
        "--version", env={**memctl_env, "MEMCTL_DATABASE_URL": "postgresql://127.0.0.1:1/x"}
    )
    assert down.exit_code == 0 and down.stdout.splitlines()[2].startswith("database not reached: ")
