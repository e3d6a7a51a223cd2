"""Recall: facts first, whole items within the token budget, degradation, access tracking, the template."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from memctl import config
from memctl.embedding.protocol import estimate_tokens
from memctl.errors import ConfigError
from memctl.recall import form, recall
from tests.conftest import needs_local_embedder

HEADER = "Relevant memory (facts are current; episodes are past events):"


def add(cli, text, *args):
    result = cli("episode", "add", text, *args)
    assert result.exit_code == 0, result.stderr
    return int(result.stdout)


def fact(cli, key, value, *args):
    assert cli("fact", "set", key, value, *args).exit_code == 0


def make_books(path: Path) -> Path:
    """A committed runbook repository with two runbooks."""
    import git

    path.mkdir(parents=True)
    repo = git.Repo.init(path)
    with repo.config_writer() as conf:
        conf.set_value("user", "name", "Test Operator")
        conf.set_value("user", "email", "ops@example.com")
    books = {
        "rotate-logs.md": "# Rotate nginx logs\n\nFrees disk space when the disk is full.\n\n"
        "## 1. Rotate\n\n```sh\nlogrotate -f /etc/logrotate.conf\n```\n",
        "refund.md": "# Refund an order\n\nFor customers who want their money back.\n\n"
        "## 1. Refund\n\n```sh\necho refund\n```\n",
    }
    for name, text in books.items():
        (path / name).write_text(text)
    repo.index.add(list(books))
    repo.index.commit("runbooks")
    return path


@pytest.fixture
def memory(cli, tmp_path):
    """An agent's facts, episodes (embedded) and runbooks; returns the episode ids and the runbook directory."""
    fact(cli, "db.host", "10.8.0.4", "--source", "ops")
    fact(cli, "deploy.freeze", "no deploys on Fridays")
    fact(cli, "lunch.place", "the noodle bar")
    ids = {
        "disk": add(
            cli,
            "Deploy failed because the disk was full; rotating nginx logs fixed it",
            "--agent",
            "ops",
            "--source",
            "ticket:42",
            "--created-at",
            "2026-01-01T00:00:00Z",
        ),
        # unrelated events from sources of their own: no episode is another's neighbour (no windows)
        "replica": add(
            cli,
            "The postgres replica on db-2 lagged during the deploy",
            "--agent",
            "ops",
            "--source",
            "monitoring",
        ),
        "refund": add(
            cli, "A customer asked for a refund of order 1234", "--agent", "ops", "--source", "crm"
        ),
        "other": add(cli, "Deploy of the mobile app went fine", "--agent", "someone-else"),
    }
    assert cli("embed").exit_code == 0
    return ids, make_books(tmp_path / "books")


def run(cli, *args):
    result = cli("recall", *args)
    assert result.exit_code == 0, result.stderr
    return result


def kinds_of(text: str) -> list[str]:
    return [line.split("]")[0].split(",")[0].removeprefix("- [") for line in text.splitlines()[1:]]


def test_text_block_facts_first_then_episodes_then_runbooks_within_300_tokens(cli, memory):
    ids, books = memory
    out = run(
        cli,
        "the deploy to db.host failed, the disk is full",
        "--agent",
        "ops",
        "--max-tokens",
        "300",
        "--repo",
        str(books),
    ).stdout
    lines = out.splitlines()
    assert lines[0] == HEADER
    assert (
        lines[1] == "- [fact] db.host = 10.8.0.4 (current fact, source: ops)"
    )  # the key verbatim: first
    kinds = kinds_of(out)
    assert kinds == sorted(kinds, key=["fact", "episode", "runbook"].index) and set(kinds) == {
        "fact",
        "episode",
        "runbook",
    }
    assert any(
        line.startswith("- [episode, ")
        and "ago, source: ticket:42] Deploy failed because the disk" in line
        for line in lines
    )
    assert "- [runbook] rotate-logs: Rotate nginx logs" in lines
    assert "mobile app" not in out  # another agent's episode
    assert estimate_tokens(out) <= 300
    assert out.endswith("\n") and "\n\n" not in out


def test_budget_is_never_exceeded_and_only_whole_leading_items_are_kept(cli, memory):
    _, books = memory
    observation = "the deploy to db.host failed, the disk is full; refund the customer"
    full = run(cli, observation, "--repo", str(books), "--no-track", "-f", "json").json()
    texts = [item["text"] for item in full["items"]]
    assert len(texts) >= 5 and full["left_out"] == 0
    assert full["tokens"] == estimate_tokens(HEADER + "\n") + sum(
        estimate_tokens(t + "\n") for t in texts
    )
    # every budget where the outcome changes: exactly enough for n items, and one token less
    ends = [
        full["tokens"] - sum(estimate_tokens(t + "\n") for t in texts[n:])
        for n in range(1, len(texts) + 1)
    ]
    for budget in sorted({1, *ends, *(e - 1 for e in ends)}):
        args = (observation, "--repo", str(books), "--no-track", "--max-tokens", str(budget))
        if (
            budget < ends[0]
        ):  # found, but not even the first item fits: a usage error, not silence (issue 40)
            refused = cli("recall", *args, "-f", "json")
            assert refused.exit_code == 2 and "none fits" in refused.stderr and refused.stdout == ""
            continue
        doc = run(cli, *args, "-f", "json").json()
        kept = [item["text"] for item in doc["items"]]
        assert (
            kept == texts[: len(kept)]
        )  # a prefix, in order: stops at the first item that does not fit
        assert doc["tokens"] <= budget and doc["left_out"] == len(texts) - len(kept)
        assert len(kept) == sum(e <= budget for e in ends)
        text = run(cli, *args).stdout
        assert text == (HEADER + "\n" + "".join(t + "\n" for t in kept) if kept else "")
        assert estimate_tokens(text) <= budget


def test_nothing_relevant_prints_nothing_and_exits_0(cli, memory):
    _, books = memory
    result = cli("recall", "purple elephant smoothie recipe", "--repo", str(books))
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "")
    assert cli("recall", "purple elephant", "-f", "jsonl").stdout == ""
    assert cli("recall", "purple elephant", "-f", "json").json()["items"] == []


def test_json_items_carry_kind_score_tokens_and_the_total(cli, memory):
    ids, _ = memory
    doc = run(cli, "db.host deploy disk", "--agent", "ops", "-f", "json").json()
    assert doc["tokens"] <= doc["max_tokens"] == 1000 and doc["mode"] == "hybrid"
    assert doc["token_counter"].startswith("estimate")
    first = doc["items"][0]
    assert (first["kind"], first["key"], first["score"]) == ("fact", "db.host", 1.0)
    episodes = [i for i in doc["items"] if i["kind"] == "episode"]
    assert ids["disk"] in [e["id"] for e in episodes]
    for item in doc["items"]:
        assert item["tokens"] == estimate_tokens(item["text"] + "\n") and isinstance(
            item["score"], float
        )
    lines = run(cli, "db.host deploy disk", "--agent", "ops", "-f", "jsonl").jsonl()
    assert [i["text"] for i in lines] == [i["text"] for i in doc["items"]]


def test_min_score_drops_items(cli, memory):
    _, books = memory
    observation = "deploy to db.host, the disk is full"
    doc = run(cli, observation, "--repo", str(books), "-f", "json", "--no-track").json()
    scores = sorted({i["score"] for i in doc["items"]})
    assert len(scores) >= 3
    cut = scores[len(scores) // 2]
    kept = run(
        cli, observation, "--repo", str(books), "-f", "json", "--min-score", str(cut)
    ).json()["items"]
    assert kept and all(i["score"] >= cut for i in kept)
    assert [i["text"] for i in kept] == [i["text"] for i in doc["items"] if i["score"] >= cut]
    assert run(cli, observation, "--repo", str(books), "--min-score", "99").stdout == ""


def test_near_duplicate_episodes_collapse_onto_the_best(cli):
    first = add(
        cli,
        "Deploy failed because the disk was full; rotating nginx logs fixed it",
        "--created-at",
        "2025-01-01T00:00:00Z",
    )
    second = add(cli, "deploy failed because the DISK was full - rotating nginx logs fixed it!")
    different = add(
        cli, "Deploy failed because the disk was full on web-2", "--source", "web-2"
    )  # no window
    cli("embed")
    items = run(cli, "deploy failed disk full", "-f", "json").json()["items"]
    episodes = {i["id"]: i for i in items if i["kind"] == "episode"}
    assert set(episodes) == {second, different}  # the newer copy scores higher and stays
    assert episodes[second]["duplicates"] == [first] and episodes[different]["duplicates"] == []


def test_access_counts_rise_for_what_recall_and_search_returned(cli, conn, memory):
    from memctl.records import access

    ids, _ = memory

    def counts():
        return {r["episode_id"]: r["access_count"] for r in access.stats(conn, list(ids.values()))}

    assert counts() == {}
    doc = run(cli, "refund the customer order", "--agent", "ops", "-k", "1", "-f", "json").json()
    assert [i["id"] for i in doc["items"] if i["kind"] == "episode"] == [ids["refund"]]
    assert counts() == {ids["refund"]: 1}
    run(cli, "refund the customer order", "--agent", "ops", "-k", "1")
    assert counts() == {ids["refund"]: 2}
    run(cli, "refund the customer order", "--agent", "ops", "-k", "1", "--no-track")
    assert counts() == {ids["refund"]: 2}
    found = cli(
        "episode", "search", "postgres replica lag", "--agent", "ops", "-k", "1", "-f", "json"
    ).json()
    assert [r["id"] for r in found] == [ids["replica"]]
    assert counts() == {ids["refund"]: 2, ids["replica"]: 1}
    cli("episode", "search", "postgres replica lag", "--agent", "ops", "-k", "1", "--no-track")
    assert counts() == {ids["refund"]: 2, ids["replica"]: 1}
    batch = "".join(
        json.dumps({"query": q, "agent": "ops", "k": 1}) + "\n"
        for q in ("postgres replica lag", "replica lagged", "refund customer order")
    )
    assert cli("episode", "search", "--batch", "-", input=batch).exit_code == 0
    assert counts() == {ids["refund"]: 3, ids["replica"]: 3}
    rows = {r["episode_id"]: r for r in access.stats(conn, [ids["replica"]])}
    assert rows[ids["replica"]]["last_accessed_at"] > datetime.datetime.now(
        datetime.timezone.utc
    ) - datetime.timedelta(minutes=5)
    # deleting an episode takes its access row with it
    assert cli("episode", "delete", str(ids["refund"])).exit_code == 0
    assert counts() == {ids["replica"]: 3}


def test_recency_can_count_from_last_access(cli, memory_env_config):
    old = add(cli, "certificate renewal for the shop", "--created-at", "2020-01-01T00:00:00Z")
    cli("embed")

    def recency():
        return cli("episode", "search", "certificate renewal", "-f", "json", "--no-track").json()[
            0
        ]["recency"]

    assert recency() < 0.01  # six years old, never accessed: recency from creation
    memory_env_config('[search]\nrecency_from = "accessed"\n')
    assert recency() < 0.01
    run(cli, "certificate renewal")  # recall returns it: an access
    assert recency() > 0.99
    memory_env_config("")
    assert recency() < 0.01
    assert old


@pytest.fixture
def memory_env_config(memctl_env):
    def write(text: str) -> None:
        Path(memctl_env["MEMCTL_CONFIG"]).write_text(text)

    return write


def test_template_from_the_config(cli, memory, memory_env_config):
    memory_env_config(
        '[recall]\ntemplate = """\n<memory>\n{items}\n</memory>\n"""\nmax_tokens = 40\n'
    )
    out = run(cli, "db.host deploy disk", "--agent", "ops").stdout
    lines = out.splitlines()
    assert lines[0] == "<memory>" and lines[-1] == "</memory>" and len(lines) >= 3
    assert estimate_tokens(out) <= 40
    memory_env_config('[recall]\ntemplate = "no placeholder"\n')
    bad = cli("recall", "db.host")
    assert bad.exit_code == 1 and "{items}" in bad.stderr and bad.stdout == ""


def test_line_formats_and_bad_fields():
    settings = config.Settings(
        recall=config.Recall(
            template="Memory:\n{items}\n",
            fact_line="* {key}: {value}{sourced} ({score:.1f})",
            episode_line="* ({age}) {content}",
            runbook_line="* runbook {name}",
        )
    )
    made = form.template(settings)
    assert (made.header, made.footer) == ("Memory:\n", "\n")
    line = made.line(
        "fact", {"key": "a.b", "value": "two\nlines", "sourced": ", source: x", "score": 0.25}
    )
    assert line == "* a.b: two lines, source: x (0.2)"
    settings.recall.episode_line = "{nope}"
    with pytest.raises(ConfigError, match="episode_line"):
        form.template(settings)


def test_facts_match_by_key_and_value_words_and_stay_in_their_namespace(cli):
    fact(cli, "db.host", "10.8.0.4")
    fact(cli, "backup.window", "nightly at 02:00, the database is read only")
    fact(cli, "db.host", "10.9.9.9", "--namespace", "staging")
    fact(cli, "lunch.place", "noodles")
    doc = run(cli, "is the database host still up? backups failing", "-f", "json").json()
    keys = [(i["key"], i["score"]) for i in doc["items"]]
    assert [k for k, _ in keys] == [
        "backup.window",
        "db.host",
    ]  # 2 key words + value word, then 1 key word
    assert all(0 < s < 1 for _, s in keys)
    staged = run(cli, "db.host", "--namespace", "staging", "-f", "json").json()["items"]
    assert [(i["value"], i["score"]) for i in staged] == [("10.9.9.9", 1.0)]


def test_without_runbook_repository_no_runbook_section_and_a_broken_one_warns(
    cli, memory, tmp_path
):
    _, books = memory
    plain = run(cli, "disk full nginx logs")
    assert "[runbook]" not in plain.stdout and plain.stderr == ""
    with_env = cli("recall", "disk full nginx logs", env={"MEMCTL_RUNBOOKS": str(books)})
    assert "- [runbook] rotate-logs: Rotate nginx logs" in with_env.stdout
    broken = cli("recall", "disk full nginx logs", "--repo", str(tmp_path / "missing"))
    assert (
        broken.exit_code == 0
        and "runbooks left out" in broken.stderr
        and "[episode" in broken.stdout
    )


def test_bad_requests(cli):
    assert cli("recall", "   ").exit_code == 2
    assert cli("recall", "x", "--max-tokens", "0").exit_code == 2
    assert cli("recall", "x", "-k", "0").exit_code == 2
    assert cli("recall", "-", input=b"\xff\xfe").exit_code == 2


def test_stdin_observation(cli, memory):
    out = cli("recall", "-", "--agent", "ops", input="db.host deploy")
    assert out.exit_code == 0 and out.stdout.splitlines()[1].startswith(
        "- [fact] db.host = 10.8.0.4"
    )


SLOW_MACHINE = (
    "[embedding]\nsearch_timeout = 60\n"  # a loaded machine must not turn "up" into a timeout
)


def test_ollama_down_degrades_to_words_with_a_warning(
    cli, ollama, ollama_env, memory, memory_env_config
):
    _, books = memory  # embedded through the test server's all-minilm
    memory_env_config(SLOW_MACHINE)
    up = run(
        cli,
        "the deploy to db.host failed, the disk is full",
        "--agent",
        "ops",
        "--max-tokens",
        "300",
        "--repo",
        str(books),
        "-f",
        "json",
    ).json()
    assert up["mode"] == "hybrid"
    ollama.down()
    result = run(
        cli,
        "the deploy to db.host failed, the disk is full",
        "--agent",
        "ops",
        "--max-tokens",
        "300",
        "--repo",
        str(books),
    )
    assert "text search only" in result.stderr and result.stderr.count("\n") == 1
    kinds = kinds_of(result.stdout)
    assert kinds[0] == "fact" and "episode" in kinds and "runbook" in kinds
    assert "Deploy failed because the disk was full" in result.stdout
    assert estimate_tokens(result.stdout) <= 300
    nothing = cli("recall", "purple elephant smoothie recipe", "--repo", str(books))
    assert (nothing.exit_code, nothing.stdout) == (0, "")


@pytest.mark.real_minilm
def test_ollama_real_minilm_gates_unrelated_episodes_and_long_observations_still_embed(
    cli, ollama, ollama_env, memory, memory_env_config
):
    ids, _ = memory
    memory_env_config(SLOW_MACHINE)
    nothing = cli("recall", "what is a good recipe for banana bread", "-f", "json")
    assert nothing.json()["items"] == []
    # shares no word with the episode but means the same: found by the vector half alone
    meaning = run(cli, "someone wants their money back", "--agent", "ops", "-f", "json").json()
    assert [i["id"] for i in meaning["items"] if i["kind"] == "episode"] == [ids["refund"]]
    ollama.requests.clear()
    long_text = (
        "the deploy failed because the disk was full " * 60
    )  # over all-minilm's 256-token context
    doc = run(cli, long_text, "--agent", "ops", "-f", "json")
    assert doc.json()["mode"] == "hybrid" and doc.stderr == ""
    assert len(ollama.embed_requests()) == 2  # refused whole, embedded from its start
    assert ids["disk"] in [i["id"] for i in doc.json()["items"] if i["kind"] == "episode"]


@pytest.mark.local
def test_local_embedder_counts_with_its_tokenizer(cli, memctl_env, monkeypatch):
    needs_local_embedder()
    monkeypatch.setenv("MEMCTL_EMBEDDER", "local")
    monkeypatch.setenv("MEMCTL_EMBED_MODEL", "all-minilm")
    fact(cli, "db.host", "10.8.0.4")
    add(cli, "Deploy failed because the disk was full; rotating nginx logs fixed it")
    assert cli("embed").exit_code == 0
    doc = run(cli, "db.host deploy disk", "-f", "json", "--max-tokens", "60").json()
    assert doc["token_counter"] == "all-minilm tokenizer"
    from memctl.embedding.local import LocalEmbedder

    tokens = LocalEmbedder().count_tokens
    assert [i["tokens"] for i in doc["items"]] == [tokens(i["text"] + "\n") for i in doc["items"]]
    text = run(cli, "db.host deploy disk", "--max-tokens", "60").stdout
    assert tokens(text) <= doc["tokens"] <= 60


def test_age_strings():
    now = datetime.datetime(2026, 3, 1, tzinfo=datetime.timezone.utc)
    ago = [
        (datetime.timedelta(seconds=5), "just now"),
        (datetime.timedelta(minutes=1), "1 minute ago"),
        (datetime.timedelta(minutes=5), "5 minutes ago"),
        (datetime.timedelta(hours=3), "3 hours ago"),
        (datetime.timedelta(days=3), "3 days ago"),
        (datetime.timedelta(days=65), "2 months ago"),
        (datetime.timedelta(days=800), "2 years ago"),
        (datetime.timedelta(minutes=-3), "just now"),
    ]
    assert [form.age(now - delta, now) for delta, _ in ago] == [text for _, text in ago]


def test_observation_words_drop_short_and_common_words():
    assert recall.observation_words("Why is the DB on web-1 failing? The disk, the disk!") == [
        "web",
        "failing",
        "disk",
    ]
