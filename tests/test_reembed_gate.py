"""The quality gate on a model switch: `reembed compare` measures recall@k and MRR of both models on known
items, `reembed switch` refuses a model that finds less beyond the tolerance unless --accept-worse, and
the job log keeps the figures every switch was made on.

The active model is the test server's word-hash stand-in for all-minilm (texts that share words come out
close); the new one, "noise-embed", carries no meaning (tests/ollama_server.py meaningless_fn: a vector
from a hash of the whole text).
"""

from __future__ import annotations

import json
import random

import pytest

from memctl.embedding import models
from memctl.reembed import quality
from tests.ollama_server import OllamaTestServer, _hash_fn, meaningless_fn

VOCABULARY = [
    f"{a}{b}"
    for a in ("bra", "clo", "dri", "fen", "gul", "hom", "jas", "kri", "lum", "mor")
    for b in ("tap", "vex", "wix", "zul", "quo", "nip", "rak", "sog", "tev", "yum")
]
TOPICS = [
    "kafka",
    "nginx",
    "redis",
    "postgres",
    "certificate",
    "dns",
    "backup",
    "cron",
    "ldap",
    "haproxy",
    "grafana",
    "vault",
]


@pytest.fixture
def server():
    with OllamaTestServer() as running:
        running.add_model("all-minilm", 384, 256, _hash_fn("all-minilm", 384))
        running.add_model("noise-embed", 384, 512, meaningless_fn(384))
        yield running


def episode(i: int) -> str:
    """Two sentences that share two words of their own and nothing else with other episodes."""
    words = random.Random(i).sample(VOCABULARY, 12)
    key = [f"{TOPICS[i % len(TOPICS)]}", f"host{i}"]
    return (
        " ".join(key[:1] + words[:6] + key[1:])
        + ". "
        + " ".join(words[6:9] + key + words[9:])
        + "."
    )


def load(cli, n: int = 48) -> None:
    lines = [json.dumps({"content": episode(i)}) for i in range(n)]
    assert cli("episode", "import", "-", input="\n".join(lines) + "\n").exit_code == 0
    assert cli("embed").exit_code == 0


def backfill(cli, model: str = "noise-embed") -> None:
    assert cli("reembed", "start", "--model", model).exit_code == 0
    ran = cli("reembed", "run")
    assert ran.exit_code == 0, ran.stderr


def test_the_known_items_leave_the_asked_part_out():
    text = (
        "Short one. The kafka broker on host3 ran out of disk at night. Rotating the logs freed it."
    )
    assert quality.split(text) == (
        "The kafka broker on host3 ran out of disk at night.",
        "Short one. Rotating the logs freed it.",
    )
    assert quality.split("disk full on host3 again today") == ("disk full on", "host3 again today")
    assert quality.split("too short here") is None


def test_a_switch_to_a_model_that_finds_less_is_refused_unless_accepted(
    cli, conn, server_env, server
):
    load(cli)
    backfill(cli)
    compared = cli("reembed", "compare", "-f", "json")
    assert compared.exit_code == 0, compared.stderr
    measured = compared.json()["quality"]
    assert measured["source"] == "memory" and measured["queries"] == 48
    assert "built from the memory itself" in compared.stderr
    assert measured["active"]["recall@10"] >= 0.9 and measured["new"]["recall@10"] <= 0.5
    assert measured["active"]["mrr"] > measured["new"]["mrr"] and measured["worse"] is True
    table = cli("reembed", "compare")
    assert (
        table.exit_code == 0
        and "recall@10" in table.stdout
        and "switch` will refuse it" in table.stdout
    )

    refused = cli("reembed", "switch")
    assert refused.exit_code == 1
    old, new = measured["active"]["recall@10"], measured["new"]["recall@10"]
    assert f"recall@10 {old}" in refused.stderr and f"recall@10 {new}" in refused.stderr
    assert "--accept-worse" in refused.stderr
    assert (
        models.active(conn).model == "all-minilm"
        and models.by_state(conn, "backfill").model == "noise-embed"
    )
    assert cli("jobs", "--job", "reembed-switch", "-f", "json").json() == []

    accepted = cli("reembed", "switch", "--accept-worse", "-f", "json")
    assert accepted.exit_code == 0, accepted.stderr
    assert "--accept-worse" in accepted.stderr and f"recall@10 {new}" in accepted.stderr
    assert models.active(conn).model == "noise-embed"
    [job] = cli("jobs", "--job", "reembed-switch", "-f", "json").json()
    assert job["outcome"] == "ok" and job["detail"]["accepted_worse"] is True
    figures = job["detail"]["figures"]
    assert figures["active"]["recall@10"] == old and figures["new"]["recall@10"] == new
    assert figures["tolerance"] == quality.TOLERANCE and figures["source"] == "memory"


def test_a_model_no_worse_switches_and_the_job_log_keeps_its_figures(cli, conn, server_env, server):
    server.add_model(
        "other-hash", 384, 512, _hash_fn("other-hash", 384)
    )  # words, as the active model
    load(cli, 24)
    backfill(cli, "other-hash")
    switched = cli("reembed", "switch")
    assert switched.exit_code == 0, switched.stderr
    [job] = cli("jobs", "--job", "reembed-switch", "-f", "json").json()
    assert job["detail"]["accepted_worse"] is False and job["detail"]["figures"]["queries"] == 24
    assert (
        job["detail"]["figures"]["new"]["recall@10"]
        >= job["detail"]["figures"]["active"]["recall@10"] - 0.02
    )


def test_known_items_from_a_file(cli, conn, server_env, server, tmp_path):
    load(cli, 24)
    backfill(cli)
    items = tmp_path / "known.jsonl"
    items.write_text(
        json.dumps({"query": episode(0).split(". ")[0], "episodes": [1]})
        + "\n"
        + json.dumps({"query": "redis host2", "texts": ["redis host2"]})
        + "\n"
        + "a plain query, for the overlap only\n"
    )
    compared = cli("reembed", "compare", "--queries", str(items), "-f", "json")
    assert compared.exit_code == 0, compared.stderr
    result = compared.json()
    assert result["quality"]["source"] == str(items) and result["quality"]["queries"] == 2
    assert (
        result["quality"]["active"]["recall@10"] == 1.0
        and result["quality"]["active"]["mrr"] == 1.0
    )
    assert [r["query"] for r in result["rows"]] == ["a plain query, for the overlap only"]
    refused = cli("reembed", "switch", "--queries", str(items), "-k", "1")
    assert refused.exit_code == 1 and f"{items}" in refused.stderr

    items.write_text(json.dumps({"query": "x", "texts": ["no episode says this"]}) + "\n")
    bad = cli("reembed", "compare", "--queries", str(items))
    assert bad.exit_code == 2 and "line 1: texts: no episode holds" in bad.stderr
    items.write_text("\n" + json.dumps({"query": "x", "episode": [1]}) + "\n")
    bad = cli("reembed", "compare", "--queries", str(items))
    assert bad.exit_code == 2 and "line 2: unknown field(s): episode" in bad.stderr


def test_an_empty_memory_switches_saying_there_is_nothing_to_measure(cli, conn, server_env, server):
    assert cli("embed").exit_code == 0
    backfill(cli)
    switched = cli("reembed", "switch")
    assert switched.exit_code == 0, switched.stderr
    assert "nothing to measure" in switched.stderr
    assert models.active(conn).model == "noise-embed"
    [job] = cli("jobs", "--job", "reembed-switch", "-f", "json").json()
    assert job["detail"]["figures"]["queries"] == 0 and job["detail"]["figures"]["active"] is None


def log_line(i: int) -> str:
    """A templated log line: the same words in every line but a number, a host and a code."""
    return (
        f"worker {i % 7} on host{i % 5} restarted after error E{100 + i} at 03:{i % 60:02d}: the job queue "
        f"was drained and the connection pool reset, retry {i % 3} of 3 scheduled by the supervisor"
    )


def test_on_log_like_memory_the_gate_cannot_judge_and_refuses_unless_given_queries(
    cli, conn, server_env, server, tmp_path
):
    """The known items built from a memory of templated lines are found by nothing, the active model included:
    the gate says it cannot judge and refuses, unless --queries (known items the operator vouches for) or
    --accept-worse; compare says so too."""
    lines = [json.dumps({"content": log_line(i)}) for i in range(60)]
    assert cli("episode", "import", "-", input="\n".join(lines) + "\n").exit_code == 0
    assert cli("embed").exit_code == 0
    backfill(cli)
    compared = cli("reembed", "compare", "-f", "json")
    assert compared.exit_code == 0, compared.stderr
    measured = compared.json()["quality"]
    assert measured["active"]["recall@10"] < quality.JUDGE_FLOOR and measured["judged"] is False, (
        measured
    )
    assert "cannot judge" in compared.stderr
    refused = cli("reembed", "switch")
    assert (
        refused.exit_code == 1
        and "cannot judge" in refused.stderr
        and "--queries" in refused.stderr
    )
    assert models.active(conn).model == "all-minilm"
    items = tmp_path / "known.jsonl"
    items.write_text(
        "".join(
            json.dumps(
                {"query": f"the error E{100 + i} restarted worker {i % 7}", "episodes": [i + 1]}
            )
            + "\n"
            for i in range(12)
        )
    )
    by_file = cli("reembed", "switch", "--queries", str(items), "-k", "3")
    assert by_file.exit_code == 1 and "finds less" in by_file.stderr, (
        by_file.stderr
    )  # judged on the operator's items
    accepted = cli("reembed", "switch", "--accept-worse")
    assert accepted.exit_code == 0, accepted.stderr
    assert models.active(conn).model == "noise-embed"
