"""Hybrid search: text before embedding, filters, degradation, batch, weighting, the HNSW scan settings its
transactions run under, and labelled retrieval sets (one that only the text half answers)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import psycopg
import pytest

from memctl import config
from memctl.embedding import models
from memctl.reading import bm25, scan, search
from memctl.reading.query import Query
from memctl.reading.pieces import pieces
from memctl.reading.scan import vector_half
from tests.conftest import needs_local_embedder
from tests.scan_witness import SCAN_NOW, scan_witness

DATA = json.loads((Path(__file__).parent / "data" / "retrieval.json").read_text())


def add(cli, text, *args, env=None):
    result = cli("episode", "add", text, *args, env=env)
    assert result.exit_code == 0, result.stderr
    return int(result.stdout)


def test_fresh_episode_is_found_by_words_before_any_embedding(cli):
    episode = add(cli, "rotating nginx logs freed the disk")
    result = cli("episode", "search", "nginx disk", "-f", "json")
    assert result.exit_code == 0
    assert [r["id"] for r in result.json()] == [episode]
    assert "text search only" in result.stderr


def test_json_rows_carry_score_components(cli):
    add(
        cli,
        "the deploy failed because the disk was full",
        "--kind",
        "conversation",
        "--source",
        "ticket:1",
    )
    cli("embed")
    row = cli("episode", "search", "deploy disk", "-f", "json").json()[0]
    for field in (
        "id",
        "score",
        "agent",
        "kind",
        "source",
        "importance",
        "created_at",
        "content",
        "relevance",
        "recency",
        "importance_term",
        "vector_rank",
        "text_rank",
    ):
        assert field in row
    assert row["vector_rank"] == 1 and row["text_rank"] == 1
    assert row["relevance"] == pytest.approx(1.0)


def test_text_half_uses_or_semantics(cli):
    answer = add(cli, "rotating nginx logs freed four gigabytes")
    add(cli, "unrelated note about lunch")
    # a question shares only one word with its answer: AND semantics would find nothing
    found = cli(
        "episode",
        "search",
        "why were the nginx servers failing yesterday",
        "--mode",
        "text",
        "-f",
        "json",
    )
    assert [r["id"] for r in found.json()] == [answer]


def test_filters_agent_kind_source_since(cli):
    a = add(cli, "backup finished", "--agent", "a1", "--kind", "raw", "--source", "cron")
    b = add(cli, "backup failed", "--agent", "a2", "--kind", "summary", "--source", "cron")
    c = add(
        cli,
        "backup skipped",
        "--agent",
        "a1",
        "--kind",
        "summary",
        "--source",
        "human",
        "--created-at",
        "2020-01-01T00:00:00Z",
    )
    cli("embed")
    for mode in ("hybrid", "vector", "text"):

        def ids(*args):
            return {
                r["id"]
                for r in cli(
                    "episode", "search", "backup", "--mode", mode, *args, "-f", "json"
                ).json()
            }

        assert ids("--agent", "a1") == {a, c}
        assert ids("--kind", "summary") == {b, c}
        assert ids("--source", "cron") == {a, b}
        assert ids("--since", "30d") == {a, b}
        assert ids("--agent", "a1", "--kind", "summary") == {c}


def test_agent_filter_never_starves_the_vector_half(cli):
    lines = "".join(
        json.dumps(
            {"content": f"routine heartbeat number {i} all systems nominal", "agent": "busy"}
        )
        + "\n"
        for i in range(400)
    )
    assert cli("episode", "import", "-", input=lines).exit_code == 0
    rare = {
        add(cli, f"rare agent memory {i} about something else", "--agent", "rare") for i in range(5)
    }
    cli("embed", "--batch-size", "200")
    found = cli(
        "episode",
        "search",
        "routine heartbeat nominal",
        "--mode",
        "vector",
        "--agent",
        "rare",
        "-k",
        "5",
        "-f",
        "json",
    ).json()
    assert {r["id"] for r in found} == rare


def test_recency_and_importance_weighting(cli):
    old = add(
        cli,
        "certificate renewal for the shop",
        "--created-at",
        "2024-01-01T00:00:00Z",
        "--importance",
        "5",
    )
    new = add(cli, "certificate renewal for the shop!", "--importance", "5")
    cli("embed")
    order = [r["id"] for r in cli("episode", "search", "certificate renewal", "-f", "json").json()]
    assert order.index(new) < order.index(old)
    low = add(cli, "rotate the vpn keys", "--importance", "1")
    high = add(cli, "rotate the vpn keys.", "--importance", "10")
    cli("embed")
    hits = cli("episode", "search", "rotate vpn keys", "-f", "json").json()
    order = [r["id"] for r in hits]
    assert order.index(high) < order.index(low)


def test_ollama_down_or_slow_degrades_to_text_with_one_warning(cli, ollama, ollama_env, memctl_env):
    episode = add(cli, "the queue backed up and we scaled consumers")
    assert cli("embed").exit_code == 0
    ollama.down()
    down = cli("episode", "search", "queue consumers", "-f", "json")
    assert down.exit_code == 0
    assert [r["id"] for r in down.json()] == [episode]
    assert down.stderr.count("memctl:") == 1 and "text search only" in down.stderr
    assert cli("episode", "search", "queue", "--mode", "vector").exit_code == 3
    ollama.up()
    ollama.inject("slow", delay_s=5)
    Path(memctl_env["MEMCTL_CONFIG"]).write_text("[embedding]\nsearch_timeout = 0.5\n")
    slow = cli("episode", "search", "queue consumers", "-f", "json")
    assert slow.exit_code == 0 and [r["id"] for r in slow.json()] == [episode]
    assert "did not answer" in slow.stderr
    ollama.clear()
    Path(memctl_env["MEMCTL_CONFIG"]).write_text(
        "[embedding]\nsearch_timeout = 30\n"
    )  # a loaded CI machine
    healthy = cli("episode", "search", "queue consumers", "-f", "json")
    assert healthy.stderr == "" and healthy.json()[0]["vector_rank"] == 1


def test_batch_search_one_line_per_query_in_order_one_embed_call(cli, ollama, ollama_env):
    first = add(cli, "postgres replica lag is two seconds")
    second = add(cli, "redis evicted keys under memory pressure")
    cli("embed")
    ollama.requests.clear()
    queries = [
        {"query": "redis evictions"},
        {"query": "replica lag", "k": 1},
        {"query": "redis", "agent": "nobody"},
    ]
    result = cli(
        "episode", "search", "--batch", "-", input="".join(json.dumps(q) + "\n" for q in queries)
    )
    assert result.exit_code == 0, result.stderr
    lines = result.jsonl()
    assert [line["query"] for line in lines] == ["redis evictions", "replica lag", "redis"]
    assert lines[0]["results"][0]["id"] == second
    assert [r["id"] for r in lines[1]["results"]] == [first]
    assert lines[2]["results"] == []
    assert [n for _, _, n in ollama.embed_requests()] == [3]
    bad = cli("episode", "search", "--batch", "-", input='{"query": "ok"}\n{"nope": 1}\n')
    assert (
        bad.exit_code == 2 and "1 of 2 line(s) failed" in bad.stderr
    )  # README: one rule for batches
    assert bad.jsonl()[0]["query"] == "ok" and bad.jsonl()[1]["error"].startswith("line 2: ")


def test_bad_queries(cli):
    assert cli("episode", "search", "x", "--mode", "fuzzy").exit_code == 2
    assert cli("episode", "search", " ").exit_code == 2
    assert cli("episode", "search").exit_code == 2


def test_fact_stale_finds_copies_of_an_old_value(cli):
    cli("fact", "set", "db.host", "10.8.0.4")
    copy = add(cli, "connect to the primary at 10.8.0.4 on port 5432")
    add(cli, "unrelated: lunch is at noon")
    cli("embed")
    cli("fact", "set", "db.host", "10.8.0.9")
    stale = cli("fact", "stale", "db.host", "-f", "json")
    assert stale.exit_code == 0, stale.stderr
    rows = stale.json()
    assert [(r["id"], r["old_value"], r["found_by"]) for r in rows if r["found_by"] == "text"] == [
        (copy, "10.8.0.4", "text")
    ]
    assert cli("fact", "stale", "never.set").exit_code == 4


def recall_at_5(conn, settings, mode: str, ids: list[int]) -> float:
    conn.use_settings(settings)
    hits = 0
    for question in DATA["questions"]:
        outcome = search.search(conn, Query(question["q"], k=5, mode=mode))
        found = {h.id for h in outcome.hits}
        wanted = {ids[a - 1] for a in question["answers"]}
        hits += len(found & wanted) / len(wanted)
    return hits / len(DATA["questions"])


@pytest.mark.local
def test_labelled_retrieval_set_hybrid_at_least_the_better_half(cli, conn, memctl_env, monkeypatch):
    needs_local_embedder()
    monkeypatch.setenv("MEMCTL_EMBEDDER", "local")
    monkeypatch.setenv("MEMCTL_EMBED_MODEL", "all-minilm")
    ids = [add(cli, text) for text in DATA["episodes"]]
    assert cli("embed").exit_code == 0
    settings = config.load()
    scores = {mode: recall_at_5(conn, settings, mode, ids) for mode in ("hybrid", "vector", "text")}
    print("recall@5", scores)
    assert scores["vector"] > scores["text"]  # paraphrases: words alone miss most of them
    assert scores["hybrid"] >= max(scores["vector"], scores["text"])


LOG = json.loads((Path(__file__).parent / "data" / "retrieval_log.json").read_text())


@pytest.mark.local
def test_operations_log_set_hybrid_at_least_the_better_half(cli, conn, memctl_env, monkeypatch):
    needs_local_embedder()
    monkeypatch.setenv("MEMCTL_EMBEDDER", "local")
    monkeypatch.setenv("MEMCTL_EMBED_MODEL", "all-minilm")
    ids = [add(cli, text, "--created-at", when) for when, text in LOG["episodes"]]
    assert cli("embed").exit_code == 0
    settings = config.load()
    conn.use_settings(settings)
    scores = {}
    for mode in ("hybrid", "vector", "text"):
        total = 0.0
        for question in LOG["questions"]:
            found = {h.id for h in search.search(conn, Query(question["q"], k=5, mode=mode)).hits}
            wanted = {ids[a - 1] for a in question["answers"]}
            total += len(found & wanted) / len(wanted)
        scores[mode] = total / len(LOG["questions"])
    print("recall@5", scores)
    assert scores["hybrid"] >= max(scores["vector"], scores["text"])


def _import(cli, rows):
    lines = "".join(json.dumps(r) + "\n" for r in rows)
    result = cli("episode", "import", "-", input=lines)
    assert result.exit_code == 0, result.stderr


def test_only_the_rarest_words_find_within_match_rows_and_the_others_still_score(
    cli, conn, memctl_env
):
    # "widget" is in 40 episodes, "sprocket" in 3; with match_rows = 10 only sprocket finds
    _import(
        cli,
        [{"content": f"widget inventory note {i}"} for i in range(40)]
        + [{"content": f"sprocket order {i}"} for i in range(2)]
        + [{"content": "sprocket and widget order"}],
    )
    assert cli("embed").exit_code == 0
    conn.execute("ANALYZE episodes")
    Path(memctl_env["MEMCTL_CONFIG"]).write_text("[search]\nmatch_rows = 10\ncandidates = 50\n")
    settings = config.load()
    conn.use_settings(settings)
    stats = bm25.term_stats(conn)
    wanted = pieces(conn, "widget sprocket", stats).wanted
    plan = bm25.plan(conn, stats, wanted, common_share=None, match_rows=10)
    assert plan.terms == ["'widget'", "'sprocket'"] and plan.matched == ["'sprocket'"]
    assert bm25.document_frequencies(conn, stats, plan.terms) == pytest.approx([41, 3])
    # words the statistics do not know are counted exactly, in the statement that parses the query
    unknown = bm25.TermStats(n=stats.n, avgdl=stats.avgdl, common={})
    pieces(conn, 'widget sprocket -order "sprocket order"', unknown)
    assert unknown.counted == {"'widget'": 41, "'sprocket'": 3, "'sprocket' <-> 'order'": 2}
    hits = search.search(conn, Query("widget sprocket", k=50)).hits
    by_words = {h.id for h in hits if h.text_rank is not None}
    assert len(by_words) == 3 and all("sprocket" in h.content for h in hits if h.id in by_words)
    both = next(h for h in hits if h.content == "sprocket and widget order")
    single = [h for h in hits if h.content.startswith("sprocket order")]
    assert both.text_score > max(h.text_score for h in single)  # widget scores what sprocket found
    # on words alone every word finds again
    text_only = search.search(conn, Query("widget sprocket", k=50, mode="text")).hits
    assert len(text_only) == 43


def test_the_match_bound_grows_with_the_memory(cli, conn, memctl_env):
    # a share of the episodes, never under match_rows: 1M episodes at 1% -> 10,000; 50k -> the floor
    assert bm25.match_bound(bm25.TermStats(n=1_000_000, avgdl=10, common={}), 1000, 0.01) == 10_000
    assert bm25.match_bound(bm25.TermStats(n=50_000, avgdl=10, common={}), 1000, 0.01) == 1000
    # through search: "widget" is in 41 of 43 episodes; match_rows = 10 alone keeps it from finding,
    # a share of 1.0 (43 episodes) lets it find every one
    _import(
        cli,
        [{"content": f"widget inventory note {i}"} for i in range(40)]
        + [{"content": f"sprocket order {i}"} for i in range(2)]
        + [{"content": "sprocket and widget order"}],
    )
    assert cli("embed").exit_code == 0
    conn.execute("ANALYZE episodes")
    found = {}
    for share in (0, 1.0):
        Path(memctl_env["MEMCTL_CONFIG"]).write_text(
            f"[search]\nmatch_rows = 10\nmatch_share = {share}\ncandidates = 50\n"
        )
        bm25._CACHE.clear()  # the statistics after this test's ANALYZE
        hits = search.search(conn.use_settings(config.load()), Query("widget", k=50)).hits
        found[share] = {h.id for h in hits if h.text_rank is not None}
    assert found[0] == set() and len(found[1.0]) == 41


def test_the_common_lexemes_literal_reads_back_as_the_list(conn):
    # sent as one text[] literal, made once per statistics: quotes, backslashes, commas and braces survive
    awkward = {
        "plain": 1.0,
        'dou"ble': 1.0,
        "back\\slash": 1.0,
        "it's": 1.0,
        "a,b": 1.0,
        "{x}": 1.0,
        "": 1.0,
    }
    stats = bm25.TermStats(n=10, avgdl=1, common=awkward)
    back = conn.execute("SELECT %s::text[] AS a", (stats.common_array,)).fetchone()["a"]
    assert back == stats.common_queries and len(back) == len(awkward)
    assert stats.common_array is stats.common_array  # made once


def test_words_all_find_when_the_vector_half_finds_nothing(cli, conn, memctl_env):
    _import(cli, [{"content": f"widget inventory note {i}", "agent": "old"} for i in range(30)])
    assert cli("embed").exit_code == 0  # a model is registered and these are embedded
    fresh = [
        add(cli, f"widget shipped {i}", "--agent", "new") for i in range(3)
    ]  # not embedded yet
    conn.execute("ANALYZE episodes")
    Path(memctl_env["MEMCTL_CONFIG"]).write_text("[search]\nmatch_rows = 5\n")
    found = cli("episode", "search", "widget", "--agent", "new", "-f", "json")
    assert found.exit_code == 0, found.stderr
    assert sorted(r["id"] for r in found.json()) == fresh
    assert all(r["vector_rank"] is None and r["text_rank"] is not None for r in found.json())


def test_an_episode_added_after_a_search_is_found_by_its_rare_word_at_once(cli, conn):
    add(cli, "the usual deploy notes")
    settings = config.load()
    conn.use_settings(settings)
    assert search.search(conn, Query("zebracorn", mode="text")).hits == []
    episode = add(cli, "a zebracorn appeared in the logs")
    hits = search.search(conn, Query("zebracorn", mode="text")).hits
    assert [h.id for h in hits] == [episode]


def test_one_statement_serves_every_mode_with_negation_and_context(cli, conn):
    before = add(cli, "we talked about the database migration", "--kind", "conversation")
    answer = add(cli, "it finished at noon", "--kind", "conversation")
    noise = add(cli, "database migration dry run", "--kind", "raw")
    assert cli("embed").exit_code == 0
    settings = config.load()
    conn.use_settings(settings)
    for mode in ("hybrid", "text", "vector"):
        hits = search.search(conn, Query('database migration -"dry run"', k=10, mode=mode)).hits
        ids = [h.id for h in hits]
        assert noise not in ids, mode
        if mode != "vector":
            assert before in ids and answer in ids, (
                mode
            )  # the answer came in as the neighbour's context


def test_rare_words_counted_in_one_agent_are_scaled_to_the_whole_table(cli, conn):
    # scoped counting is what a Citus coordinator uses, so that a query for one agent stays on its shard
    _import(
        cli,
        [{"content": f"sprocket {i}" if i < 3 else f"gear {i}", "agent": "a"} for i in range(10)]
        + [{"content": "sprocket b" if i < 1 else f"gear b{i}", "agent": "b"} for i in range(30)],
    )
    conn.execute("ANALYZE episodes")
    stats = bm25.term_stats(conn)
    assert stats.citus is False and stats.agents == pytest.approx({"b": 0.75, "a": 0.25})
    unknown = bm25.TermStats(n=stats.n, avgdl=stats.avgdl, common={}, agents=stats.agents)
    pieces(conn, "sprocket", unknown, scope="a")
    assert unknown.counted == {"'sprocket'": pytest.approx(3 / 0.25)}
    whole = bm25.TermStats(n=stats.n, avgdl=stats.avgdl, common={})
    pieces(conn, "sprocket", whole)
    assert whole.counted == {"'sprocket'": 4}
    assert bm25.agent_share(conn, whole, "b") == pytest.approx(
        0.75
    )  # counted: not in its statistics


TOKENS = json.loads((Path(__file__).parent / "data" / "retrieval_tokens.json").read_text())
# Measured with all-MiniLM-L6-v2 (19 questions): hybrid 0.947, text 0.947, vector 0.474, and hybrid with the
# text half switched off (TEXT_HALF_OFF) 0.474: the floor sits between, with room for one more miss.
TOKENS_FLOOR = 0.85
TEXT_HALF_OFF = "[search]\ntext_weight = 0.0\ncontext_weight = 0.0\n"


def _recall_at(conn, settings, data: dict, ids: list[int], mode: str, k: int) -> float:
    """Mean share of each question's answers among its first k hits."""
    conn.use_settings(settings)
    total = 0.0
    for question in data["questions"]:
        found = {h.id for h in search.search(conn, Query(question["q"], k=k, mode=mode)).hits}
        wanted = {ids[a - 1] for a in question["answers"]}
        total += len(found & wanted) / len(wanted)
    return total / len(data["questions"])


@pytest.mark.local
def test_exact_tokens_set_is_answered_by_the_text_half(cli, conn, memctl_env, monkeypatch):
    """Twins that differ only in a ticket id, host, error code or version: the words pick the one named.

    Fails when the text half stops counting (text_weight = 0, or BM25 broken): embeddings alone
    rank the twins by chance.
    """
    needs_local_embedder()
    monkeypatch.setenv("MEMCTL_EMBEDDER", "local")
    monkeypatch.setenv("MEMCTL_EMBED_MODEL", "all-minilm")
    ids = [add(cli, text, "--created-at", when) for when, text in TOKENS["episodes"]]
    assert cli("embed").exit_code == 0
    conn.execute(
        "ANALYZE episodes"
    )  # the term statistics (common words) as a served database has them
    settings = config.load()
    scores = {
        mode: _recall_at(conn, settings, TOKENS, ids, mode, 1)
        for mode in ("hybrid", "vector", "text")
    }
    Path(memctl_env["MEMCTL_CONFIG"]).write_text(TEXT_HALF_OFF)
    scores["hybrid, text half off"] = _recall_at(conn, config.load(), TOKENS, ids, "hybrid", 1)
    print("recall@1", scores)
    assert scores["hybrid"] >= TOKENS_FLOOR
    # the set needs the words: without them the same search falls below the floor
    assert scores["vector"] < TOKENS_FLOOR and scores["hybrid, text half off"] < TOKENS_FLOOR


def test_every_vector_statement_of_search_runs_under_the_scan_settings(cli, conn, memctl_env):
    for text in ("backup finished", "backup failed on db-2", "lunch at noon"):
        add(cli, text, "--agent", "ops")
    assert cli("embed").exit_code == 0
    Path(memctl_env["MEMCTL_CONFIG"]).write_text("[search]\nef_search = 7\n")
    settings = config.load()
    conn.use_settings(settings)
    seen = scan_witness(conn)
    for mode in (
        "hybrid",
        "vector",
    ):  # one statement each, in a transaction of scan.ScanTransactions
        assert search.search(conn, Query("backup", mode=mode, agent="ops")).hits
    model = models.active(conn)
    vectors, _ = search.embed_queries(settings, model, ["backup"])
    assert vector_half(conn, model, vectors[0], Query("backup"), 5)  # fact stale, reembed compare
    assert seen == [[{"ef": "7", "scan": "relaxed_order"}]] * 3
    # SET LOCAL: the session outside search's transactions keeps pgvector's defaults
    assert conn.execute(SCAN_NOW).fetchone() == {"ef": "40", "scan": "off"}


def test_search_defaults_are_the_config_schema_s(memctl_env):
    loaded = config.load().search  # an empty configuration file: every [search] key at its default
    assert (
        loaded == config.Settings().search == config.Search()
    )  # settings made in code: the same, no second copy


def test_a_batch_shares_its_transactions_each_at_most_scans_seconds(
    cli, conn, memctl_env, monkeypatch
):
    for text in ("backup finished", "backup failed on db-2", "lunch at noon", "disk full on web-3"):
        add(cli, text)
    assert cli("embed").exit_code == 0
    settings = config.load()
    conn.use_settings(settings)
    queries = ["backup", "lunch", "disk full", "backup failed", "noon"]
    # each vector statement's transaction start (now()) and the scan it ran under
    seen = scan_witness(
        conn, "SELECT now() AS began, current_setting('hnsw.iterative_scan') AS scan"
    )
    outcomes = search.search_batch(conn, [Query(q) for q in queries])
    assert all(o.hits and o.mode == "hybrid" for o in outcomes)
    assert len(seen) == len(queries) and {r[0]["scan"] for r in seen} == {"relaxed_order"}
    assert len({r[0]["began"] for r in seen}) == 1  # one BEGIN, one SET, one COMMIT for the batch
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # committed at the end
    seen.clear()
    # a transaction no longer than nothing, a query at a time: each query's statement in one of its own
    monkeypatch.setattr(scan.ScanTransactions, "seconds", 0.0)
    monkeypatch.setattr(search, "WINDOW", 1)
    again = search.search_batch(conn, [Query(q) for q in queries])
    assert [{h.id for h in o.hits} for o in again] == [{h.id for h in o.hits} for o in outcomes]
    assert len({r[0]["began"] for r in seen}) == len(queries)


def test_a_pipelined_batch_answers_as_its_queries_one_at_a_time(cli, conn, memctl_env):
    """A batch's statements go through one pipeline, a window of queries ahead of the scoring (search._run_steps):
    every query gets the answer it gets alone, over several windows, with words, phrases, exclusions,
    filters and a query that runs nothing among them."""
    lines = "".join(
        json.dumps(
            {
                "content": f"{w} incident {i} on web-{i % 7}: {v}",
                "agent": f"a{i % 3}",
                "kind": "conversation" if i % 2 else "observation",
            }
        )
        + "\n"
        for i, (w, v) in enumerate(
            (w, v)
            for w in ("disk", "nginx", "redis", "backup", "deploy")
            for v in ("fixed", "paged the on-call", "rolled back", "ignored")
        )
    )
    assert cli("episode", "import", "-", input=lines).exit_code == 0
    assert cli("embed").exit_code == 0
    settings = config.load()
    conn.use_settings(settings)
    texts = [
        "disk incident",
        "nginx -web-3",
        '"rolled back" deploy',
        "redis paged",
        "!!!",
        "backup fixed",
        "incident on web-2",
        "deploy ignored -redis",
        "what broke on web-5?",
    ]
    queries = [
        Query(t, k=5, agent=(None, "a1")[i % 2], kind=(None, "conversation", None)[i % 3])
        for i, t in enumerate(texts * 5)
    ]  # 45 queries: three windows
    assert len(queries) > 2 * search.WINDOW
    batch = search.search_batch(conn, queries)
    alone = [search.search(conn, q) for q in queries]
    assert [[h.id for h in o.hits] for o in batch] == [[h.id for h in o.hits] for o in alone]
    assert (
        [o.note for o in batch] == [o.note for o in alone] and batch[4].note and not batch[4].hits
    )
    assert sum(bool(o.hits) for o in batch) >= 35


def test_a_statement_reused_by_shape_is_the_one_composed_for_it(memctl_env):
    """statement() composes once per shape: every combination of halves, filters, words and neighbours gets
    the text composed for exactly it (a shape that missed one of them would hand out another's)."""
    import itertools

    from memctl.reading import statement as st

    settings = config.load()
    model = models.Model(
        id=1,
        embedder="hash",
        model="m",
        dims=3,
        storage="vector",
        request_dims=None,
        table_name="vectors_1_m_3",
        state="active",
    )
    stats = bm25.TermStats(n=10.0, avgdl=5.0, common={})
    st._TEXTS.clear()
    for vector, filters, terms, matched, context, excluded in itertools.product(
        (False, True),
        itertools.product((None, "x"), repeat=5),
        (0, 1, 3),
        (False, True),
        (False, True),
        (False, True),
    ):
        agent, kind, source, since, until = filters
        query = Query(
            "q", agent=agent, kind=kind, source=source, since=since and "1d", until=until and "1h"
        )
        words = [f"'w{i}'" for i in range(terms)]
        plan = (
            bm25.Plan(words, [1.0] * terms, [], words[:1] if matched else [], float(terms))
            if terms
            else None
        )
        halves = st.StatementParts(
            model=model if vector else None,
            vector=[1.0, 0, 0] if vector else None,
            plan=plan,
            stats=stats,
            excluded=["'z'"] if excluded else [],
            context=context,
        )
        text, params = st.statement(query, halves, settings, 50)
        if text is None:
            assert not vector and not (terms and matched)
            continue
        fresh = st._compose(query, halves, "match" in params, 50).as_bytes(None)
        assert text == fresh
        names = set(re.findall(rb"%\((\w+)\)", text))
        assert {n.decode() for n in names} - {"q"} <= set(params)  # every placeholder has its value
    assert 100 < len(st._TEXTS) < 2 * 32 * 3 * 2 * 2 * 2


def test_the_composed_statements_kept_are_bounded(memctl_env, monkeypatch):
    """A long-running process asked for every k keeps at most TEXTS_SIZE texts, each still the right one."""
    from memctl.reading import statement as st

    settings = config.load()
    stats = bm25.TermStats(n=10.0, avgdl=5.0, common={})
    plan = bm25.Plan(["'w'"], [1.0], [], ["'w'"], 1.0)
    monkeypatch.setattr(st, "TEXTS_SIZE", 8)
    st._TEXTS.clear()
    for k in range(1, 30):
        halves = st.StatementParts(model=None, vector=None, plan=plan, stats=stats)
        text, params = st.statement(Query("w", k=k), halves, settings, k)
        assert text == st._compose(Query("w", k=k), halves, "match" in params, k).as_bytes(None)
        assert 0 < len(st._TEXTS) <= 8
    st._TEXTS.clear()


def test_the_hybrid_statement_prepared_and_planned_once_answers_as_planned_each_time(
    cli, conn, db_url, memctl_env
):
    """Used a few times, the hybrid statement is prepared and PostgreSQL may plan it once (a generic plan):
    every query then gets the answer a fresh connection, planning it for its own values, gives."""
    from memctl import db

    lines = "".join(
        json.dumps({"content": f"{w} {v} on web-{i % 9} at {i}", "agent": f"a{i % 2}"}) + "\n"
        for i, (w, v) in enumerate(
            (w, v)
            for w in (
                "disk full",
                "nginx reload",
                "redis evicted",
                "backup failed",
                "deploy rolled back",
                "cert expired",
            )
            for v in ("paged", "fixed", "ignored", "escalated", "retried")
        )
    )
    assert cli("episode", "import", "-", input=lines).exit_code == 0
    assert cli("embed").exit_code == 0
    settings = config.load()
    conn.use_settings(settings)
    texts = [
        "disk paged",
        "nginx fixed",
        "redis retried",
        "backup escalated",
        "deploy ignored",
        "cert paged",
        "disk retried",
        "nginx escalated",
    ]
    queries = [Query(t, k=5, agent=("a0", None)[i % 2]) for i, t in enumerate(texts * 4)]
    batch = search.search_batch(conn, queries)
    alone = []
    for q in queries:
        with db.connect(db_url, vector=True) as fresh:  # never prepared: planned for its own values
            alone.append(search.search(fresh.use_settings(settings), q))
    assert [[h.id for h in o.hits] for o in batch] == [[h.id for h in o.hits] for o in alone]
    prepared = conn.execute(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
        "WHERE statement LIKE '%vec AS MATERIALIZED%'"
    ).fetchall()
    # planned once (generic) after five custom plans: the answers above include the generic plan's
    assert prepared and sum(r["generic_plans"] for r in prepared) > 0
