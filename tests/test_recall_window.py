"""Recall's windows (memctl.recall.window), recall --batch, and near-duplicates that stay reachable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memctl.embedding.protocol import estimate_tokens

T0 = "2026-03-02T08:00:00Z"


def add(cli, text, *args):
    result = cli("episode", "add", text, *args)
    assert result.exit_code == 0, result.stderr
    return int(result.stdout)


def at(minutes: int) -> str:
    return f"2026-03-02T{8 + minutes // 60:02d}:{minutes % 60:02d}:00Z"


@pytest.fixture
def log(cli):
    """Agent ops's log of one incident, told over consecutive entries, and other agents' and sources' entries
    written between them; ids by name."""
    ids = {}
    ids["early"] = add(
        cli,
        "Rotated the TLS certificate of the billing gateway",
        "--agent",
        "ops",
        "--source",
        "shift",
        "--created-at",
        at(0),
    )
    ids["far"] = add(
        cli,
        "Coffee machine on floor two is fixed",
        "--agent",
        "ops",
        "--source",
        "shift",
        "--created-at",
        at(200),
    )  # more than an hour after the one before: past the gap
    ids["q"] = add(
        cli,
        "Question from the team: why is the orders API slow since the release?",
        "--agent",
        "ops",
        "--source",
        "shift",
        "--created-at",
        at(210),
    )
    ids["spy"] = add(
        cli,
        "An unrelated agent noted something about the orders API",
        "--agent",
        "spy",
        "--source",
        "shift",
        "--created-at",
        at(211),
    )
    ids["other_source"] = add(
        cli,
        "Pager noise from another tool",
        "--agent",
        "ops",
        "--source",
        "pager",
        "--created-at",
        at(212),
    )
    ids["a"] = add(
        cli,
        "The cause: the new ORM version issues one query per line item",
        "--agent",
        "ops",
        "--source",
        "shift",
        "--created-at",
        at(215),
    )
    ids["b"] = add(
        cli,
        "Rolled back to version 5.11 and p99 went back to 120 ms",
        "--agent",
        "ops",
        "--source",
        "shift",
        "--created-at",
        at(220),
    )
    ids["c"] = add(
        cli,
        "Wrote the postmortem draft",
        "--agent",
        "ops",
        "--source",
        "shift",
        "--created-at",
        at(225),
    )
    assert cli("embed").exit_code == 0
    return ids


def config(memctl_env, text: str) -> None:
    Path(memctl_env["MEMCTL_CONFIG"]).write_text(text)


def recall_json(cli, *args):
    result = cli("recall", *args, "-f", "json", "--no-track")
    assert result.exit_code == 0, result.stderr
    return result.json()


def test_a_hit_comes_with_its_neighbours_in_time_order_marked_same_agent_and_source_within_the_gap(
    cli, log, memctl_env
):
    config(memctl_env, "[recall]\nwindow_before = 2\nwindow_after = 2\n")
    doc = recall_json(cli, "why is the orders API slow", "--agent", "ops", "-k", "1")
    windows = [i for i in doc["items"] if i["kind"] == "window"]
    assert len(windows) == 1
    w = windows[0]
    # before: "far" is within the gap of q, "early" is not (200 minutes before "far"); after: a and b.
    # Never the other agent's entry nor the other source's, though both lie between q and a.
    assert w["ids"] == [log["far"], log["q"], log["a"], log["b"]]
    assert w["matches"] == [log["q"]]
    assert [e["match"] for e in w["episodes"]] == [False, True, False, False]
    lines = w["text"].splitlines()
    assert lines[0].startswith("- [4 episodes, ") and lines[0].endswith(
        ", in time order; > matched]"
    )
    assert lines[2] == "  > Question from the team: why is the orders API slow since the release?"
    assert lines[3] == "    The cause: the new ORM version issues one query per line item"
    assert (
        log["spy"] not in w["ids"]
        and log["other_source"] not in w["ids"]
        and log["early"] not in w["ids"]
    )
    # the text block is the same block
    text = cli(
        "recall", "why is the orders API slow", "--agent", "ops", "-k", "1", "--no-track"
    ).stdout
    assert w["text"] in text


def test_windows_that_meet_merge_into_one_block(cli, log, memctl_env):
    config(memctl_env, "[recall]\nwindow_before = 1\nwindow_after = 1\n")
    # both the question and the rollback match; their windows (q, a) and (a, b, c) meet at a
    doc = recall_json(
        cli, "orders API slow release rolled back version", "--agent", "ops", "-k", "2"
    )
    windows = [i for i in doc["items"] if i["kind"] == "window"]
    assert len(windows) == 1, doc["items"]
    assert windows[0]["ids"] == sorted(
        windows[0]["ids"], key=[log[n] for n in ("far", "q", "a", "b", "c")].index
    )
    assert set(windows[0]["matches"]) == {log["q"], log["b"]} and log["a"] in windows[0]["ids"]


def test_every_token_is_charged_and_the_budget_holds(cli, log, memctl_env):
    config(memctl_env, "[recall]\nwindow_before = 2\nwindow_after = 2\n")
    filled = 0
    for budget in (30, 45, 60, 90, 1000):
        result = cli(
            "recall",
            "orders API slow release rolled back",
            "--agent",
            "ops",
            "--max-tokens",
            str(budget),
            "-f",
            "json",
            "--no-track",
        )
        if result.exit_code == 2:  # nothing fits, the header included: said, not an empty answer
            assert "none fits in that budget" in result.stderr and result.stdout == ""
            continue
        assert result.exit_code == 0, result.stderr
        doc, filled = result.json(), filled + 1
        text = cli(
            "recall",
            "orders API slow release rolled back",
            "--agent",
            "ops",
            "--max-tokens",
            str(budget),
            "--no-track",
        ).stdout
        assert doc["tokens"] <= budget and estimate_tokens(text) <= doc["tokens"] + 1
        assert sum(i["tokens"] for i in doc["items"]) <= doc["tokens"]
        for item in doc["items"]:
            if (
                item["kind"] == "window"
            ):  # a window never has a hole: its episodes run one after another
                assert len(item["ids"]) >= 2 and item["matches"]
    assert filled >= 4
    small = recall_json(
        cli, "orders API slow release rolled back", "--agent", "ops", "--max-tokens", "45"
    )
    big = recall_json(
        cli, "orders API slow release rolled back", "--agent", "ops", "--max-tokens", "1000"
    )
    assert len(json.dumps(small["items"])) < len(json.dumps(big["items"]))


def test_windows_off_give_the_hits_alone(cli, log, memctl_env):
    config(memctl_env, "[recall]\nwindow_before = 0\nwindow_after = 0\n")
    doc = recall_json(cli, "why is the orders API slow", "--agent", "ops", "-k", "1")
    assert [i["kind"] for i in doc["items"]] == ["episode"] and doc["items"][0]["id"] == log["q"]


def test_episode_search_context_prints_blocks_with_the_hit_marked(cli, log):
    rows = cli(
        "episode",
        "search",
        "why is the orders API slow",
        "--agent",
        "ops",
        "-k",
        "1",
        "--context",
        "1",
        "-f",
        "json",
        "--no-track",
    )
    assert rows.exit_code == 0, rows.stderr
    found = rows.json()
    assert [r["id"] for r in found] == [log["far"], log["q"], log["a"]]
    assert [r["match"] for r in found] == [False, True, False] and {r["block"] for r in found} == {
        1
    }
    assert found[1]["score"] is not None and found[0]["score"] is None


# ---------------------------------------------------------------------------
# recall --batch


def test_batch_answers_in_order_with_the_object_recall_json_prints(cli, log, memctl_env):
    lines = [
        {"observation": "why is the orders API slow", "agent": "ops", "k": 1},
        {"observation": "tls certificate billing gateway", "agent": "ops", "max_tokens": 60},
        {"observation": "orders API", "agent": "spy"},
    ]
    out = cli(
        "recall",
        "--batch",
        "-",
        "-f",
        "jsonl",
        "--no-track",
        input="".join(json.dumps(x) + "\n" for x in lines),
    )
    assert out.exit_code == 0, out.stderr
    answers = out.jsonl()
    assert len(answers) == 3
    alone = [
        recall_json(
            cli,
            x["observation"],
            "--agent",
            x["agent"],
            "-k",
            str(x.get("k", 5)),
            *(["--max-tokens", str(x["max_tokens"])] if "max_tokens" in x else []),
        )
        for x in lines
    ]
    assert answers == alone
    assert answers[2]["items"] and all(i["agent"] == "spy" for i in answers[2]["items"])


def test_a_bad_line_gets_an_error_object_naming_line_and_field_and_the_batch_goes_on(cli, log):
    text = (
        "\n".join(
            [
                json.dumps({"observation": "why is the orders API slow", "agent": "ops"}),
                json.dumps({"observation": "x", "k": 0}),
                "{not json",
                json.dumps({"observation": "orders", "colour": "red"}),
                json.dumps({"agent": "ops"}),
                json.dumps({"observation": "orders", "as_of": "yesterday-ish"}),
                json.dumps({"observation": "rolled back", "agent": "ops", "max_tokens": 80}),
            ]
        )
        + "\n"
    )
    out = cli("recall", "--batch", "-", "-f", "jsonl", "--no-track", input=text)
    assert out.exit_code == 2, (
        out.stderr
    )  # the first failed line's code (README: one rule for batches)
    answers = out.jsonl()
    assert len(answers) == 7
    assert [(a.get("line"), a.get("field")) for a in answers[1:6]] == [
        (2, "k"),
        (3, None),
        (4, "colour"),
        (5, "observation"),
        (6, "as_of"),
    ]
    assert all(a["error"].startswith(f"line {a['line']}: ") for a in answers[1:6])
    assert answers[0]["items"] and answers[6]["items"] and answers[6]["max_tokens"] == 80
    assert "5 of 7 line(s) failed" in out.stderr


def test_batch_needs_jsonl_and_not_an_observation_too(cli, log):
    assert cli("recall", "--batch", "-", input="{}\n").exit_code == 2
    assert cli("recall", "x", "--batch", "-", "-f", "jsonl", input="{}\n").exit_code == 2
    assert cli("recall").exit_code == 2


def test_the_mcp_recall_tool_runs_the_same_code(cli, conn, log, memctl_env):
    from memctl import config as config_mod
    from memctl.mcp import sessions, tools

    session = sessions.Session(
        config_mod.load(), sessions.Scope.make(agent="ops", read_only=True), lambda: conn
    )
    reply = tools.recall(session, "why is the orders API slow", k=1)
    doc = recall_json(cli, "why is the orders API slow", "--agent", "ops", "-k", "1")
    assert reply.data["items"] == json.loads(json.dumps(doc["items"]))


# ---------------------------------------------------------------------------
# Collapse


def test_a_near_duplicate_folded_into_a_hit_stays_reachable_by_id_on_its_line(cli, memctl_env):
    config(memctl_env, "[recall]\nwindow_before = 0\nwindow_after = 0\n")
    words = (
        "the nightly backup of the billing database failed because the disk on db-3 was full again"
    )
    first = add(
        cli, words + " at 02:00 UTC", "--created-at", "2026-01-01T00:00:00Z"
    )  # one word more
    second = add(cli, words + " at 02:00")
    assert cli("embed").exit_code == 0
    doc = recall_json(cli, "nightly backup billing database failed disk full")
    episodes = [i for i in doc["items"] if i["kind"] == "episode"]
    assert [e["id"] for e in episodes] == [second] and episodes[0]["duplicates"] == [first]
    assert f"#{first}" in episodes[0]["text"]  # the folded one's id, on the line the agent reads
    text = cli("recall", "nightly backup billing database failed disk full", "--no-track").stdout
    assert f"near-duplicates: #{first}" in text


def test_a_repeat_counts_once(cli, memctl_env):
    config(memctl_env, "[recall]\nwindow_before = 2\nwindow_after = 2\n")
    for _ in range(3):
        add(cli, "Disk on db-9 is full again", "--created-at", T0)
    assert cli("embed").exit_code == 0
    doc = recall_json(cli, "disk db-9 full")
    shown = [i for i in doc["items"] if i["kind"] in ("episode", "window")]
    assert len(shown) == 1 and shown[0]["kind"] == "episode" and shown[0]["repeats"] == 2


def test_grouped_hits_say_their_heading_once_and_more_of_them_fit_the_budget(cli, memctl_env):
    """[recall] group: hits of one agent and source with the same age are one block under one heading, in time
    order, each marked; another source's hit keeps its own line; the tokens saved hold another hit."""
    texts = [
        f"Disk alert on web{n}: /var is 9{n}% full, rotated the nginx logs" for n in range(1, 5)
    ]
    ids = [
        add(cli, t, "--agent", "ops", "--source", "pager", "--created-at", at(10 * n))
        for n, t in enumerate(texts)
    ]
    other = add(
        cli,
        "Disk alert on db1: /var is 97% full, rotated the nginx logs",
        "--agent",
        "ops",
        "--source",
        "chat",
        "--created-at",
        at(45),
    )
    assert cli("embed").exit_code == 0
    config(memctl_env, "[recall]\ngroup = false\n")
    alone = recall_json(
        cli, "disk alert full nginx logs", "--agent", "ops", "-k", "5", "--max-tokens", "2000"
    )
    assert [i["kind"] for i in alone["items"]] == ["episode"] * 5
    config(memctl_env, "[recall]\ngroup = true\n")
    doc = recall_json(
        cli, "disk alert full nginx logs", "--agent", "ops", "-k", "5", "--max-tokens", "2000"
    )
    blocks = [i for i in doc["items"] if i["kind"] == "window"]
    assert len(blocks) == 1 and blocks[0]["ids"] == ids and blocks[0]["matches"] == ids
    lines = blocks[0]["text"].splitlines()
    assert lines[0].startswith("- [4 episodes, ") and "source: pager" in lines[0]
    assert lines[1:] == [f"  > {t}" for t in texts]
    assert [i["id"] for i in doc["items"] if i["kind"] == "episode"] == [other]
    assert doc["tokens"] < alone["tokens"]
    # the budget the grouped block takes holds fewer hits alone
    config(memctl_env, "[recall]\ngroup = false\n")
    tight = recall_json(
        cli,
        "disk alert full nginx logs",
        "--agent",
        "ops",
        "-k",
        "5",
        "--max-tokens",
        str(doc["tokens"]),
    )
    assert len(tight["items"]) < 5 and tight["left_out"] >= 1


def test_hits_are_grouped_by_default_and_a_repeat_keeps_its_own_line(cli, memctl_env):
    """With no [recall] settings, hits of one agent, source and age share a heading; a folded repeat does not
    (its line says how often it was seen)."""
    config(memctl_env, "")
    a = add(
        cli,
        "Queue backlog on the billing consumer, scaled it to four workers",
        "--agent",
        "ops",
        "--source",
        "pager",
        "--created-at",
        at(0),
    )
    b = add(
        cli,
        "Queue backlog on the orders consumer, scaled it to six workers",
        "--agent",
        "ops",
        "--source",
        "pager",
        "--created-at",
        at(5),
    )
    doc = recall_json(cli, "queue backlog consumer scaled workers", "--agent", "ops")
    assert [(i["kind"], i.get("ids")) for i in doc["items"]] == [("window", [a, b])]
    assert doc["items"][0]["text"].splitlines()[0].startswith("- [2 episodes, ")
    # seen again: the repeat says so on its own line, the other hit is alone under its own heading
    add(
        cli,
        "Queue backlog on the billing consumer, scaled it to four workers",
        "--agent",
        "ops",
        "--source",
        "pager",
        "--created-at",
        at(10),
    )
    doc = recall_json(cli, "queue backlog consumer scaled workers", "--agent", "ops")
    kinds = {i["id"]: i for i in doc["items"] if i["kind"] == "episode"}
    assert set(kinds) == {a, b} and "seen 2 times" in kinds[a]["text"]
