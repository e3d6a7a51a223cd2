"""Each model's task instructions (memctl.model_catalogue.INSTRUCTIONS) reach it, and only it.

Against the Ollama-protocol test server, which records every text /api/embed receives
(tests/ollama_server.py, `inputs`): with nomic-embed-text every stored text goes with
`search_document: ` (embed worker, reembed backfill, embed timing) and every query with
`search_query: ` (search, search --batch, recall, fact stale); with all-minilm nothing is added.
The stored text is never changed. The instructions are part of the model's identity in the
registry: a database embedded without them keeps embedding without them (never a mix in one
table), `status` says so, and one re-embed gives it the model's own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memctl.embedding import models
from memctl.model_catalogue import INSTRUCTIONS, instructions

EPISODES = [
    "Deploy of api v2.3 failed at 03:10. The /var volume was full; rotating nginx logs freed 4 GB.",
    "Redis evicted keys under memory pressure. Raising maxmemory to 2 GB stopped it.",
    "The TLS certificate of the load balancer expired on Sunday. Renewal now runs from a timer.",
]
QUERIES = ["why did the release break last night?", "cache lost keys", "certificate expiry"]
RECALLED = "the api deploy is failing again with a full disk"
STALE_VALUES = ("10.8.0.4", "10.8.0.9")


@pytest.fixture
def use_model(ollama_env, monkeypatch):
    def use(name: str) -> None:
        monkeypatch.setenv("MEMCTL_EMBED_MODEL", name)
        ollama_env["MEMCTL_EMBED_MODEL"] = name

    return use


def exercise(cli) -> list[str]:
    """Every path that embeds: the worker, search (one and --batch), recall, fact stale, embed timing.
    Returns the queries it asked."""
    for text in EPISODES:
        assert cli("episode", "add", text).exit_code == 0
    assert cli("fact", "set", "db.host", STALE_VALUES[0]).exit_code == 0
    assert cli("fact", "set", "db.host", STALE_VALUES[1]).exit_code == 0
    assert cli("episode", "add", f"moved the database off {STALE_VALUES[0]}").exit_code == 0
    embedded = cli("embed", "-f", "json")
    assert embedded.exit_code == 0, embedded.stderr
    searched = cli("episode", "search", QUERIES[0], "--mode", "vector", "-f", "json")
    assert searched.exit_code == 0 and searched.json(), searched.stderr
    batch = "\n".join(json.dumps({"query": q, "mode": "vector"}) for q in QUERIES[1:]) + "\n"
    assert cli("episode", "search", "--batch", "-", "-f", "jsonl", input=batch).exit_code == 0
    recalled = cli("recall", RECALLED, "-f", "json")
    assert recalled.exit_code == 0, recalled.stderr
    stale = cli("fact", "stale", "db.host", "-f", "json")
    assert stale.exit_code == 0, stale.stderr
    assert cli("embed", "timing", "--sample", "2", "-f", "json").exit_code == 0
    return QUERIES + [RECALLED, f"db.host: {STALE_VALUES[0]}"]


def chunk_texts(conn) -> set[str]:
    return {r["content"] for r in conn.execute("SELECT content FROM chunks").fetchall()}


def test_nomic_embed_text_gets_search_document_and_search_query(cli, conn, ollama, use_model):
    use_model("nomic-embed-text")
    queries = exercise(cli)
    received = [text for model, text in ollama.inputs if model == "nomic-embed-text"]
    assert received and all(model == "nomic-embed-text" for model, _ in ollama.inputs)
    documents = {
        t.removeprefix("search_document: ") for t in received if t.startswith("search_document: ")
    }
    asked = {t.removeprefix("search_query: ") for t in received if t.startswith("search_query: ")}
    assert len(documents) + len(asked) == len(set(received)), "a text went without its instruction"
    assert documents == chunk_texts(conn)  # every stored text, and only stored texts, as documents
    assert set(queries) <= asked and asked <= set(queries)
    # The stored text stays as written.
    assert not any(t.startswith("search_") for t in chunk_texts(conn))
    stored = {r["content"] for r in conn.execute("SELECT content FROM episodes").fetchall()}
    assert set(EPISODES) <= stored
    active = models.active(conn)
    assert (active.query_prefix, active.document_prefix) == ("search_query: ", "search_document: ")
    assert "with instructions" in active.label


def test_all_minilm_gets_text_as_it_is(cli, conn, ollama, use_model):
    use_model("all-minilm")
    queries = exercise(cli)
    received = {text for model, text in ollama.inputs if model == "all-minilm"}
    assert chunk_texts(conn) <= received and received <= chunk_texts(conn) | set(queries)
    assert set(queries) <= received
    active = models.active(conn)
    assert (active.query_prefix, active.document_prefix) == (
        "",
        "",
    ) and "instructions" not in active.label


def test_the_catalogue_cites_the_model_cards():
    source = Path(instructions.__code__.co_filename).read_text()
    for name in INSTRUCTIONS:
        assert name in source
    assert source.count("https://huggingface.co/") >= 8
    assert instructions("nomic-embed-text:latest") == ("search_query: ", "search_document: ")
    assert instructions("multilingual-e5-small") == ("query: ", "passage: ")
    assert instructions("mxbai-embed-large")[1] == "" and instructions("mxbai-embed-large")[0]
    assert instructions("qwen3-embedding:0.6b")[0].startswith("Instruct: ")
    assert instructions("embeddinggemma") == (
        "task: search result | query: ",
        "title: none | text: ",
    )
    assert instructions("all-minilm") == instructions("bge-m3") == ("", "")


def test_configured_prefixes_override_the_catalogue(cli, conn, ollama, use_model, memctl_env):
    use_model("nomic-embed-text")
    Path(memctl_env["MEMCTL_CONFIG"]).write_text(
        '[embedding]\nquery_prefix = "Q: "\ndocument_prefix = ""\n'
    )
    assert cli("episode", "add", EPISODES[0]).exit_code == 0
    assert cli("embed").exit_code == 0
    assert cli("episode", "search", QUERIES[0], "--mode", "vector").exit_code == 0
    received = [text for _, text in ollama.inputs]
    assert set(received) == chunk_texts(conn) | {"Q: " + QUERIES[0]}
    active = models.active(conn)
    assert (active.query_prefix, active.document_prefix) == ("Q: ", "")
    assert cli("status", "--check").exit_code == 0  # the vectors have the instructions configured


def test_a_database_embedded_without_the_instructions_is_flagged_and_one_reembed_fixes_it(
    cli, conn, ollama, use_model
):
    use_model("nomic-embed-text")
    assert cli("episode", "add", EPISODES[0]).exit_code == 0
    assert cli("embed").exit_code == 0
    # As a database embedded before memctl knew nomic-embed-text's instructions (sql/0018 gave
    # its row the empty ones, which is what its vectors were made with).
    conn.execute("UPDATE embedding_models SET query_prefix = '', document_prefix = ''")
    ollama.clear()

    # Nothing mixes: new chunks and queries go as the table's vectors were made, without instruction.
    assert cli("episode", "add", EPISODES[1]).exit_code == 0
    embedded = cli("embed")
    assert embedded.exit_code == 0 and embedded.stderr == "", embedded.stderr
    assert cli("episode", "search", QUERIES[1], "--mode", "vector").exit_code == 0
    assert [t for _, t in ollama.inputs] == [EPISODES[1], QUERIES[1]]

    checked = cli("status", "--check", "-f", "json")
    assert checked.exit_code == 1
    [warning] = [w for w in checked.json()["warnings"] if "instruction" in w]
    assert (
        "'search_document: '" in warning
        and "memctl reembed start --model nomic-embed-text" in warning
    )

    started = cli("reembed", "start", "--model", "nomic-embed-text", "-f", "json")
    assert started.exit_code == 0, started.stderr
    assert "with instructions" in started.json()["model"]
    ollama.clear()
    assert cli("reembed", "run").exit_code == 0
    assert {t for _, t in ollama.inputs} == {"search_document: " + t for t in chunk_texts(conn)}
    switched = cli("reembed", "switch", "--accept-worse")
    assert switched.exit_code == 0, switched.stderr
    assert cli("status", "--check").exit_code == 0
    ollama.clear()
    assert cli("episode", "search", QUERIES[1], "--mode", "vector").exit_code == 0
    assert [t for _, t in ollama.inputs] == ["search_query: " + QUERIES[1]]
    # The same model with the same instructions again is no change.
    again = cli("reembed", "start", "--model", "nomic-embed-text")
    assert again.exit_code == 2 and "already the active model" in again.stderr


def test_imported_vectors_made_with_other_instructions_are_embedded_again(
    cli, conn, ollama, use_model, pg_server, tmp_path
):
    from tests.conftest import fresh_database

    use_model("nomic-embed-text")
    for text in EPISODES:
        assert cli("episode", "add", text).exit_code == 0
    assert cli("embed").exit_code == 0
    conn.execute(
        "UPDATE embedding_models SET query_prefix = '', document_prefix = ''"
    )  # made before 0018
    path = tmp_path / "export.jsonl"
    assert cli("export", "--vectors", "--out", str(path)).exit_code == 0
    header = json.loads(path.read_text().splitlines()[0])
    assert header["vectors"]["document_prefix"] == ""
    with fresh_database(pg_server, "memctl_t2") as url:
        env = {"MEMCTL_DATABASE_URL": url}
        assert (
            cli("embed", env=env).exit_code == 0
        )  # registers nomic-embed-text with its instructions
        loaded = cli("import", str(path), "-f", "json", env=env)
        assert loaded.exit_code == 0, loaded.stderr
        assert loaded.json()[0]["vectors"] == 0 and loaded.json()[0]["queued"] == len(EPISODES)
        ollama.clear()
        assert cli("embed", env=env).exit_code == 0
        assert {t for _, t in ollama.inputs} == {"search_document: " + t for t in EPISODES}
