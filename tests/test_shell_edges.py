"""The shell's rough edges (issue 40): exit codes, keys, back-dated facts, size, never-run jobs, the local model."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("key", ["a\nb", "a\tb", "a\x1b[31mb", "a\x7fb", "a\x85b"])
def test_a_fact_key_with_a_control_character_exits_2_and_writes_nothing(cli, conn, key):
    out = cli("fact", "set", key, "v")
    assert out.exit_code == 2 and "control character" in out.stderr and out.stdout == ""
    assert conn.execute("SELECT count(*) AS n FROM facts").fetchone()["n"] == 0
    assert cli("fact", "import", "-", input='{"key": "x\\ny", "value": "v"}\n').exit_code == 2
    assert conn.execute("SELECT count(*) AS n FROM facts").fetchone()["n"] == 0


def test_a_source_with_a_newline_exits_2(cli, conn):
    out = cli("episode", "add", "disk full", "--source", "app\nfake row")
    assert out.exit_code == 2 and "source" in out.stderr
    assert conn.execute("SELECT count(*) AS n FROM episodes").fetchone()["n"] == 0
