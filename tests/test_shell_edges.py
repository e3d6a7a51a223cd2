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


@pytest.mark.local
def test_a_missing_or_corrupt_local_model_falls_back_to_text_like_ollama_down(
    memctl_bin, memctl_env, tmp_path
):
    """The Quickstart's local model gone or damaged: search and recall answer by words with a warning (exit 0),
    and embed leaves rows pending with exit 3, as when Ollama is down (not exit 1)."""
    from tests.conftest import needs_local_embedder

    needs_local_embedder()
    from memctl.embedding.local import bundled_model_dir

    good, wrong = tmp_path / "good", tmp_path / "wrong"
    for target in (good, wrong):
        target.mkdir()
        (target / "tokenizer.json").symlink_to(bundled_model_dir() / "tokenizer.json")
    (good / "model.safetensors").symlink_to(bundled_model_dir() / "model.safetensors")
    (wrong / "model.safetensors").write_bytes(b"\0" * 64)
    env = {
        **memctl_env,
        "MEMCTL_EMBEDDER": "local",
        "MEMCTL_EMBED_MODEL": "all-minilm",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "MEMCTL_LOCAL_MODEL": str(good),
    }
    assert memctl_bin("episode", "add", "the disk on web-3 filled up", env=env).exit_code == 0
    assert memctl_bin("embed", env=env).exit_code == 0
    for broken in (wrong, tmp_path / "absent"):
        env["MEMCTL_LOCAL_MODEL"] = str(broken)
        found = memctl_bin("episode", "search", "disk web-3", env=env)
        assert found.exit_code == 0 and "web-3" in found.stdout and "text" in found.stderr, (
            found.stderr
        )
        recalled = memctl_bin("recall", "disk web-3", env=env)
        assert recalled.exit_code == 0 and "web-3" in recalled.stdout, recalled.stderr
        assert memctl_bin("episode", "add", "another disk alert", env=env).exit_code == 0
        embedded = memctl_bin("embed", env=env)
        assert embedded.exit_code == 3, embedded.stderr


def test_a_recall_budget_nothing_fits_in_exits_2_and_nothing_relevant_still_exits_0(cli):
    assert cli("episode", "add", "the disk on web-3 filled up with nginx logs").exit_code == 0
    tiny = cli("recall", "disk web-3 nginx", "--max-tokens", "5")
    assert tiny.exit_code == 2 and "--max-tokens 5" in tiny.stderr and "none fits" in tiny.stderr
    assert tiny.stdout == ""
    roomy = cli("recall", "disk web-3 nginx", "--max-tokens", "500")
    assert roomy.exit_code == 0 and "web-3" in roomy.stdout
    nothing = cli("recall", "quokka zanzibar", "--max-tokens", "5")
    assert nothing.exit_code == 0 and nothing.stdout == ""


def test_bad_input_is_exit_2_wherever_it_comes_from(cli, memctl_bin):
    """One rule (README, exit codes): empty text, a NUL, text that is not UTF-8 and a line that is no record are
    exit 2 in an argument, on stdin, in a field and in a JSONL line alike (were 1 in some places, 2 in others)."""
    pairs = {
        "empty": (cli("episode", "add", "  "), cli("episode", "search", "  ")),
        "NUL": (
            cli("episode", "add", "a\x00b"),
            cli("episode", "add", "ab", "--meta", '{"a": "x\\u0000y"}'),
        ),
        "UTF-8": (
            memctl_bin("episode", "add", "-", input=b"ab\xff\xfe cd"),
            memctl_bin("episode", "add", b"ab\xff".decode("utf-8", "surrogateescape")),
        ),
        "line": (
            cli("episode", "import", "-", input='{"content": "ok"}\n{nope\n'),
            cli(
                "episode",
                "import",
                "-",
                input='{"content": "ok"}\n{"content": "x", "importance": 42}\n',
            ),
        ),
    }
    for what, outcomes in pairs.items():
        assert [o.exit_code for o in outcomes] == [2, 2], (what, [o.stderr for o in outcomes])
        assert all(o.stderr.startswith("memctl: ") and o.stdout == "" for o in outcomes), what
