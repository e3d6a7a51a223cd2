"""Summaries with lineage, through the CLI against the Ollama-protocol test server's extractive chat stand-in.

The first tests follow issue 12's "How it will be checked" steps 1-8 in order; the rest cover long windows,
faults, purge, the prune switch, backdated episodes and the status warning.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from memctl import config
from memctl.retention import chat
from memctl.retention import summarize
from tests.ollama_server import first_sentences

NOW = datetime.datetime.now(datetime.timezone.utc)
CONFIG = '[retention]\nraw = "30d"\nsummary = "365d"\n\n[summarize]\nmodel = "llama3.2:3b"\n'
AGENTS = ("ops", "web")
DAYS = (33, 38, 44, 49, 54, 59)  # six days, 33-60 days old
VPN = (
    "The VPN gateway at 10.8.0.1 drops connections every 90 minutes: MTU mismatch. "
    "Lowering the tunnel MTU to 1380 fixed it."
)


def day_at(age_days: int, minute: int) -> str:
    day = (NOW - datetime.timedelta(days=age_days)).date()
    return (
        datetime.datetime.combine(day, datetime.time(9, 0), datetime.timezone.utc)
        .replace(minute=minute % 60, hour=9 + minute // 60)
        .isoformat()
    )


def window_rows(agent: str, age: int, *, count: int = 10, words: int = 0) -> list[dict]:
    filler = " ".join(f"detail{n} of the check went as expected" for n in range(words))
    rows = []
    for i in range(count):
        text = f"Episode {i} of {agent} {age} days ago: restarted worker {i} after error E{age}{i}. {filler}".strip()
        if (agent, age, i) == ("ops", 38, 4):
            text = VPN
        rows.append(
            {
                "content": text,
                "kind": "raw",
                "agent": agent,
                "source": f"agent:{agent}",
                "created_at": day_at(age, i * 5),
                "importance": 3 + i % 5,
            }
        )
    return rows


def load(cli, rows: list[dict]) -> None:
    out = cli("episode", "import", "-", input="".join(json.dumps(r) + "\n" for r in rows))
    assert out.exit_code == 0, out.stderr


def scalar(conn, query, params=None):
    return next(iter(conn.execute(query, params).fetchone().values()))


def summaries(conn) -> int:
    return scalar(conn, "SELECT count(*) FROM episodes WHERE kind = 'summary'")


@pytest.fixture
def setup(cli, ollama_env, ollama):
    """Step 1: 120 raw episodes of two agents over six days 33-60 days old, 10 from two days ago."""
    Path(ollama_env["MEMCTL_CONFIG"]).write_text(CONFIG)
    rows = [r for agent in AGENTS for age in DAYS for r in window_rows(agent, age)]
    recent = [
        {
            "content": f"Recent note {i}: cache warmed.",
            "kind": "raw",
            "agent": "ops",
            "source": "agent:ops",
            "created_at": day_at(2, i),
        }
        for i in range(10)
    ]  # one UTC day, whatever the time now
    load(cli, rows + recent)
    return ollama


def test_issue_steps_dry_run_summarize_lineage_prune_recall(cli, conn, setup):
    ollama = setup
    # 2. --dry-run lists the windows and writes nothing (and asks no model).
    dry = cli("summarize", "--dry-run", "-f", "json")
    assert dry.exit_code == 0, dry.stderr
    plan = dry.json()
    assert len(plan) == 12 and {r["episodes"] for r in plan} == {10}
    assert {r["agent"] for r in plan} == set(AGENTS) and all(r["tokens_in"] > 0 for r in plan)
    assert all(r["window_start"][11:19] == "00:00:00" for r in plan)
    assert "dry run, nothing written" in dry.stderr
    assert summaries(conn) == 0 and ollama.chat_requests() == []

    # 3. Exactly 12 summaries; a second run writes none.
    first = cli("summarize", "-f", "json")
    assert first.exit_code == 0, first.stderr
    written = first.json()
    assert len(written) == 12 and {w["sources"] for w in written} == {10}
    assert all(w["tokens_in"] > 0 and 0 < w["tokens_out"] < w["tokens_in"] for w in written)
    assert summaries(conn) == 12 and scalar(conn, "SELECT count(*) FROM summary_sources") == 120
    assert ollama.chat_overflows == []
    again = cli("summarize", "-f", "json")
    assert again.exit_code == 0 and again.json() == [] and summaries(conn) == 12
    jobs = cli("jobs", "--job", "summarize", "-f", "json").json()
    assert [(j["outcome"], j["rows"]) for j in jobs] == [("ok", 0), ("ok", 12)]

    # The summary is an episode: kind, source, window end, highest importance, window and model in meta.
    vpn = conn.execute(
        "SELECT * FROM episodes WHERE kind = 'summary' AND content LIKE '%%10.8.0.1%%'"
    ).fetchall()
    assert len(vpn) == 1
    summary = vpn[0]
    assert (
        "The VPN gateway at 10.8.0.1 drops connections every 90 minutes: MTU mismatch."
        in summary["content"]
    )
    assert summary["source"] == "summarize:llama3.2:3b" and summary["agent"] == "ops"
    start = datetime.datetime.fromisoformat(summary["meta"]["window_start"])
    assert summary["created_at"] == start + datetime.timedelta(days=1)
    assert datetime.datetime.fromisoformat(summary["meta"]["window_end"]) == summary["created_at"]
    assert summary["meta"]["model"] == "llama3.2:3b" and summary["meta"]["parts"] == 1
    assert summary["importance"] == 7  # the highest of 3..7
    assert (
        scalar(
            conn,
            "SELECT count(*) FROM chunks WHERE agent = 'ops' AND episode_id = %s",
            (summary["id"],),
        )
        >= 1
    )

    # 4. The summary lists its 10 sources; a source names the summary.
    shown = cli("episode", "show", str(summary["id"]), "-f", "json")
    assert shown.exit_code == 0, shown.stderr
    sources = shown.json()["sources"]
    assert len(sources) == 10 and all(s["exists"] for s in sources)
    source_ids = [s["id"] for s in sources]
    vpn_source = scalar(conn, "SELECT id FROM episodes WHERE content = %s", (VPN,))
    assert vpn_source in source_ids
    source_doc = cli("episode", "show", str(vpn_source), "-f", "json").json()
    assert [s["id"] for s in source_doc["summarized_in"]] == [summary["id"]] and source_doc[
        "sources"
    ] == []
    table = cli("episode", "show", str(summary["id"]))
    assert (
        table.exit_code == 0
        and "10 (0 deleted since)" in table.stdout
        and str(vpn_source) in table.stdout
    )

    # 5. Prune deletes the 120 summarized raw episodes, keeps the 10 recent ones and 5 unsummarized 40-day-old
    # ones, keeps every summary, and the lineage still lists the deleted sources.
    load(
        cli,
        [
            {
                "content": f"Late note {i}: disk at 81%.",
                "kind": "raw",
                "agent": "web",
                "source": "agent:web",
                "created_at": day_at(40, i),
            }
            for i in range(5)
        ],
    )
    plan = {r["kind"]: r for r in cli("prune", "-f", "json").json()}
    assert (plan["raw"]["rows"], plan["raw"]["kept_for_summary"]) == (120, 5)
    pruned = cli("prune", "--yes", "-f", "json")
    assert pruned.exit_code == 0, pruned.stderr
    raw = {r["kind"]: r for r in pruned.json()}["raw"]
    assert (raw["rows"], raw["kept_for_summary"], raw["remaining"]) == (120, 5, 0)
    assert "kept 5 raw episode(s) past their age that no summary holds yet" in pruned.stderr
    assert scalar(conn, "SELECT count(*) FROM episodes WHERE kind = 'raw'") == 15
    assert scalar(conn, "SELECT count(*) FROM episodes WHERE content LIKE 'Late note%%'") == 5
    assert summaries(conn) == 12
    after = cli("episode", "show", str(summary["id"]), "-f", "json").json()["sources"]
    assert [s["id"] for s in after] == source_ids and not any(s["exists"] for s in after)
    assert all(len(s["content_hash"]) == 64 for s in after)

    # 6. Recall about the VPN surfaces the summary (the raw episode is gone).
    assert cli("embed").exit_code == 0
    recalled = cli("recall", "why does the VPN gateway drop connections?", "-f", "json")
    assert recalled.exit_code == 0, recalled.stderr
    assert summary["id"] in [
        i.get("id") for i in recalled.json()["items"] if i["kind"] == "episode"
    ]

    # The 5 late episodes get their summary on the next run, and prune then deletes them.
    late = cli("summarize", "-f", "json").json()
    assert [(w["agent"], w["sources"]) for w in late] == [("web", 5)]


def test_chat_down_exits_3_and_writes_nothing(cli, conn, setup):
    setup.down()
    out = cli("summarize")
    assert out.exit_code == 3 and "unreachable" in out.stderr
    assert summaries(conn) == 0
    assert cli("jobs", "--job", "summarize", "-f", "json").json()[0]["outcome"] == "unavailable"


@pytest.mark.parametrize("fault", ["500", "slow"])
def test_chat_failing_or_slow_exits_3_and_writes_nothing(cli, conn, setup, ollama_env, fault):
    Path(ollama_env["MEMCTL_CONFIG"]).write_text(CONFIG + "timeout = 0.5\n")
    setup.inject(fault, delay_s=3)
    out = cli("summarize")
    assert out.exit_code == 3, out.stderr
    assert summaries(conn) == 0


@pytest.mark.parametrize(
    "fault, said",
    [("empty", "empty summary"), ("refusal", "refusal"), ("long", "longer than its input")],
)
def test_a_bad_answer_fails_its_window_alone(cli, conn, setup, fault, said):
    setup.inject_answer(fault, times=1)
    out = cli("summarize", "-f", "json")
    assert out.exit_code == 1 and said in out.stderr
    assert len(out.json()) == 11 and summaries(conn) == 11
    job = cli("jobs", "--job", "summarize", "-f", "json").json()[0]
    assert job["outcome"] == "partial" and said in job["error"]
    assert len(job["detail"]["failed"]) == 1 and said in job["detail"]["failed"][0]["error"]
    retry = cli("summarize", "-f", "json")
    assert retry.exit_code == 0 and len(retry.json()) == 1 and summaries(conn) == 12


def test_an_empty_answer_for_every_window_writes_no_summary(cli, conn, setup):
    setup.inject_answer("empty")
    out = cli("summarize")
    assert out.exit_code == 1 and "12 window(s) failed" in out.stderr
    assert summaries(conn) == 0


def test_unknown_model_exits_1_with_the_pull_hint(cli, conn, setup, ollama_env):
    Path(ollama_env["MEMCTL_CONFIG"]).write_text(CONFIG.replace("llama3.2:3b", "qwen3:8b"))
    out = cli("summarize")
    assert out.exit_code == 1 and "ollama pull qwen3:8b" in out.stderr
    assert summaries(conn) == 0


def test_no_model_is_a_configuration_error_and_the_timer_skips(cli, ollama_env):
    Path(ollama_env["MEMCTL_CONFIG"]).write_text('[retention]\nraw = "30d"\n')
    out = cli("summarize")
    assert out.exit_code == 1 and "[summarize] model" in out.stderr
    skipped = cli("summarize", "--skip-if-off")
    assert skipped.exit_code == 0 and "summaries are off" in skipped.stderr


def test_systemd_render_includes_the_summarize_timer(cli):
    out = cli("systemd", "render", "--bin", "/opt/memctl/bin/memctl")
    assert out.exit_code == 0, out.stderr
    assert "# --- memctl-summarize.timer ---" in out.stdout
    assert "ExecStart=/opt/memctl/bin/memctl summarize --skip-if-off\n" in out.stdout


def test_a_long_window_is_summarized_in_parts_without_overflowing_the_context(
    cli, conn, ollama_env, ollama
):
    Path(ollama_env["MEMCTL_CONFIG"]).write_text(CONFIG)
    rows = window_rows("ops", 40, count=60, words=12)  # ~100 words each: about 3 requests' worth
    rows.append(
        {
            "content": "Huge dump: " + " ".join(f"line{n} value {n}." for n in range(4000)),
            "kind": "raw",
            "agent": "ops",
            "source": "agent:ops",
            "created_at": day_at(40, 200),
        }
    )
    load(cli, rows)
    out = cli("summarize", "-f", "json")
    assert out.exit_code == 0, out.stderr
    [written] = out.json()
    assert written["sources"] == 61
    meta = conn.execute(
        "SELECT meta, content FROM episodes WHERE id = %s", (written["summary_id"],)
    ).fetchone()
    assert meta["meta"]["parts"] >= 3 and meta["meta"]["rounds"] >= 2
    assert len(ollama.chat_requests()) == meta["meta"]["requests"] > meta["meta"]["parts"]
    assert ollama.chat_overflows == []  # no request exceeded the context: nothing was cut
    # Every episode's first sentence made it through the parts and the summary of the parts.
    for i in (0, 30, 59):
        assert (
            f"Episode {i} of ops 40 days ago: restarted worker {i} after error E40{i}."
            in meta["content"]
        )
    assert "(piece 1 of" in meta["content"]  # the huge episode went in pieces, not truncated


def test_the_stand_in_says_when_its_context_is_exceeded(ollama):
    import ollama as client_mod

    client = client_mod.Client(host=ollama.url)
    text = "\n".join(f"Line {n} says something. And more." for n in range(1200))
    answer = client.chat(model="llama3.2:3b", messages=[{"role": "user", "content": text}])
    assert (
        "exceeds the context length" in answer.message.content and answer.prompt_eval_count == 4096
    )
    assert ollama.chat_overflows and ollama.chat_overflows[0][1] == 4096
    ok = client.chat(
        model="llama3.2:3b", messages=[{"role": "user", "content": "A b. C d.\nE f. G."}]
    )
    assert ok.message.content == first_sentences("A b. C d.\nE f. G.") == "A b.\nE f."
    shown = client.show("llama3.2:3b")
    assert shown.modelinfo["llama.context_length"] == 4096
    assert "llama3.2:3b" in [m.model for m in client.list().models]


def test_an_answer_read_from_a_truncated_prompt_fails_the_window(cli, conn, ollama_env, ollama):
    """Text whose tokens memctl underestimates (one-letter words: 2 characters, but a token each) overflows the
    model's context; Ollama would cut the prompt silently. The answer's prompt_eval_count gives it away."""
    Path(ollama_env["MEMCTL_CONFIG"]).write_text(CONFIG)
    load(
        cli,
        [
            {
                "content": f"Dense {i}: " + "x " * 1000,
                "kind": "raw",
                "agent": "ops",
                "source": "agent:ops",
                "created_at": day_at(40, i),
            }
            for i in range(10)
        ],
    )
    out = cli("summarize")
    assert out.exit_code == 1 and "may have read the input truncated" in out.stderr
    assert ollama.chat_overflows and summaries(conn) == 0


def test_purge_deletes_the_summaries_built_from_the_source_and_says_so(cli, conn, setup):
    assert cli("summarize").exit_code == 0
    dry = cli("purge", "--source", "agent:ops", "-f", "json")
    assert (
        dry.exit_code == 0
        and len(dry.json()["summaries"]) == 6
        and "would also delete 6 summaries" in dry.stderr
    )
    assert summaries(conn) == 12
    done = cli("purge", "--source", "agent:ops", "--yes", "-f", "json")
    assert done.exit_code == 0, done.stderr
    assert "also deleted 6 summaries built from 'agent:ops'" in done.stderr
    assert len(done.json()["summaries"]) == 6
    left = conn.execute("SELECT DISTINCT agent FROM episodes WHERE kind = 'summary'").fetchall()
    assert [r["agent"] for r in left] == ["web"] and summaries(conn) == 6
    assert scalar(conn, "SELECT count(*) FROM summary_sources WHERE agent = 'ops'") == 0


def test_purge_finds_summaries_after_prune_deleted_the_sources(cli, conn, setup):
    assert cli("summarize").exit_code == 0
    assert cli("prune", "--yes").exit_code == 0
    assert scalar(conn, "SELECT count(*) FROM episodes WHERE source = 'agent:web'") == 0
    done = cli("purge", "--source", "agent:web", "--yes", "-f", "json")
    assert done.exit_code == 0 and len(done.json()["summaries"]) == 6
    assert (
        scalar(conn, "SELECT count(*) FROM episodes WHERE kind = 'summary' AND agent = 'web'") == 0
    )


def test_require_summary_false_lets_prune_delete_unsummarized_episodes(
    cli, conn, setup, ollama_env
):
    kept = {r["kind"]: r for r in cli("prune", "-f", "json").json()}["raw"]
    assert (kept["rows"], kept["kept_for_summary"]) == (0, 120)
    Path(ollama_env["MEMCTL_CONFIG"]).write_text(
        CONFIG.replace('summary = "365d"\n', 'summary = "365d"\nrequire_summary = false\n')
    )
    plan = {r["kind"]: r for r in cli("prune", "-f", "json").json()}["raw"]
    assert (plan["rows"], plan["kept_for_summary"]) == (120, 0)
    assert cli("prune", "--yes").exit_code == 0
    assert scalar(conn, "SELECT count(*) FROM episodes WHERE kind = 'raw'") == 10


def test_without_a_model_prune_does_not_wait(cli, conn, setup, ollama_env):
    Path(ollama_env["MEMCTL_CONFIG"]).write_text('[retention]\nraw = "30d"\nsummary = "365d"\n')
    assert {r["kind"]: r for r in cli("prune", "-f", "json").json()}["raw"]["rows"] == 120


def test_episodes_backdated_into_a_summarized_window_get_an_addendum(cli, conn, setup):
    assert cli("summarize", "--agent", "ops", "-f", "json").exit_code == 0
    assert summaries(conn) == 6
    first = scalar(
        conn, "SELECT id FROM episodes WHERE kind = 'summary' AND content LIKE '%%10.8.0.1%%'"
    )
    load(
        cli,
        [
            {
                "content": "Backdated: the VPN MTU was set on the spare gateway too.",
                "kind": "raw",
                "agent": "ops",
                "source": "agent:ops",
                "created_at": day_at(38, 200),
            }
        ],
    )
    plan = cli("summarize", "--agent", "ops", "--dry-run", "-f", "json").json()
    assert [(r["episodes"], r["addendum_to"]) for r in plan] == [(1, first)]
    added = cli("summarize", "--agent", "ops", "-f", "json").json()
    assert [w["sources"] for w in added] == [1]
    meta = conn.execute(
        "SELECT meta FROM episodes WHERE id = %s", (added[0]["summary_id"],)
    ).fetchone()["meta"]
    assert meta["addendum_to"] == first
    assert cli("summarize", "--agent", "ops", "-f", "json").json() == []  # nothing summarized twice
    assert (
        scalar(
            conn,
            "SELECT count(*) FROM (SELECT source_id FROM summary_sources GROUP BY 1 "
            "HAVING count(*) > 1) d",
        )
        == 0
    )


def test_older_than_limit_and_agent_choose_the_windows(cli, conn, setup):
    assert len(cli("summarize", "--dry-run", "--older-than", "50d", "-f", "json").json()) == 4
    assert len(cli("summarize", "--dry-run", "--older-than", "1d", "-f", "json").json()) == 13
    assert len(cli("summarize", "--dry-run", "--agent", "web", "-f", "json").json()) == 6
    out = cli("summarize", "--limit", "2", "-f", "json").json()
    assert len(out) == 2 and summaries(conn) == 2
    assert cli("summarize", "--older-than", "soon").exit_code == 2


def test_overdue_warns_until_the_windows_are_summarized(cli, conn, setup, ollama_env):
    settings = config.load(Path(ollama_env["MEMCTL_CONFIG"]))
    conn.use_settings(settings)
    warning = summarize.overdue(conn)
    assert (
        warning is not None and "120 episode(s) of raw" in warning and "memctl summarize" in warning
    )
    assert cli("summarize").exit_code == 0
    assert summarize.overdue(conn) is None
    off = config.load(Path(ollama_env["MEMCTL_CONFIG"]), environ={})
    conn.use_settings(off)
    off.summarize.model = None
    assert summarize.overdue(conn) is None


def test_summarize_config_is_validated(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        '[summarize]\nmodel = "llama3.2:3b"\nkinds = "raw"\nafter = "soon"\n'
        '[retention]\nrequire_summary = "yes"\n'
    )
    with pytest.raises(config.ConfigError) as caught:
        config.load(path)
    message = str(caught.value)
    assert "[summarize] kinds" in message and "[summarize] after" in message
    assert "[retention] require_summary" in message
    path.write_text(
        '[summarize]\nkinds = ["raw", "conversation"]\n[retention]\nraw = "30d"\nsummary = "1y"\n'
    )
    settings = config.load(path)
    assert summarize.kinds(settings) == ["raw", "conversation"]
    path.write_text(
        '[retention]\nraw = "30d"\nsummary = "1y"\nconversation = "90d"\nkeep_importance = 9\n'
    )
    assert summarize.kinds(config.load(path)) == ["conversation", "raw"]


def _wait_for(condition, what: str, limit_s: float = 120) -> None:
    """Poll until condition() holds; the limit only keeps a broken run from hanging, it asserts no timing."""
    import time

    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def test_kill_9_loses_at_most_the_window_in_flight_and_a_rerun_finishes(
    cli, conn, setup, ollama_env
):
    import os
    import signal
    import subprocess
    import sys

    ollama = setup
    exe = Path(sys.executable).parent / "memctl"
    if not exe.exists():
        pytest.skip("no installed memctl beside this Python")
    ollama.inject(None, delay_s=30)
    ollama.inject_answer("hang", after=5)  # five windows answered, the sixth held
    try:
        proc = subprocess.Popen(
            [str(exe), "summarize"],
            env={**os.environ, **ollama_env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_for(
                lambda: len(ollama.chat_requests()) >= 6 or proc.poll() is not None,
                "the sixth chat request",
            )
            assert proc.poll() is None
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
    finally:
        ollama.inject_answer(None)
        ollama.delay_s = 5.0
    # Each window was its own transaction: the five answered windows are there, whole; the sixth left nothing.
    assert summaries(conn) == 5 and scalar(conn, "SELECT count(*) FROM summary_sources") == 50
    _wait_for(
        lambda: (
            scalar(
                conn,
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s",
                (summarize.LOCK_CLASS,),
            )
            == 0
        ),
        "the killed session's window lock to go",
    )
    rerun = cli("summarize", "-f", "json")
    assert rerun.exit_code == 0, rerun.stderr
    assert len(rerun.json()) == 7 and summaries(conn) == 12
    assert scalar(conn, "SELECT count(DISTINCT source_id) FROM summary_sources") == 120
    outcomes = [j["outcome"] for j in cli("jobs", "--job", "summarize", "-f", "json").json()]
    assert outcomes == ["ok", "running"]  # the killed run's row says so


def test_a_blocked_summarize_source_fails_every_window_and_writes_nothing(cli, conn, setup):
    assert cli("source", "block", "summarize:llama3.2:3b", "--reason", "testing").exit_code == 0
    out = cli("summarize", "--agent", "web")
    assert (
        out.exit_code == 1 and "the summary was refused" in out.stderr and "blocked" in out.stderr
    )
    assert summaries(conn) == 0 and scalar(conn, "SELECT count(*) FROM summary_sources") == 0


def test_a_window_larger_than_a_page_is_summarized_whole(
    cli, conn, ollama_env, ollama, monkeypatch
):
    """Pages of a few episodes (and one episode longer than a page, alone in its page): every episode is read,
    summarized in parts and held by the lineage."""
    Path(ollama_env["MEMCTL_CONFIG"]).write_text(CONFIG)
    monkeypatch.setattr(summarize, "PAGE_BYTES", 2000)
    monkeypatch.setattr(summarize, "PAGE_ROWS", 7)
    rows = window_rows("ops", 40, count=60, words=12)
    rows.insert(
        30,
        {
            "content": "Long entry. " + "word " * 1000,
            "kind": "raw",
            "agent": "ops",
            "source": "agent:ops",
            "created_at": day_at(40, 147),
        },
    )
    load(cli, rows)
    out = cli("summarize", "-f", "json")
    assert out.exit_code == 0, out.stderr
    [written] = out.json()
    assert written["sources"] == 61
    meta = conn.execute(
        "SELECT meta, content FROM episodes WHERE id = %s", (written["summary_id"],)
    ).fetchone()
    assert meta["meta"]["parts"] > 1 and meta["meta"]["sources"] == 61
    assert (
        scalar(
            conn,
            "SELECT count(*) FROM summary_sources l JOIN episodes e ON e.agent = l.agent "
            "AND e.id = l.source_id AND e.kind = 'raw' WHERE l.summary_id = %s",
            (written["summary_id"],),
        )
        == 61
    )
    for i in range(60):  # every page reached the model, in time order
        assert (
            f"Episode {i} of ops 40 days ago: restarted worker {i} after error E40{i}."
            in meta["content"]
        )
    assert (
        meta["content"].index("Episode 29 of")
        < meta["content"].index("Long entry.")
        < meta["content"].index("Episode 30 of")
    )


class _Meddling(chat.OllamaChat):
    """The real client to the test server; runs `meddle` once, at the first request (the input is recorded)."""

    def __init__(self, url: str, meddle) -> None:
        super().__init__("llama3.2:3b", host=url, timeout=30)
        self.meddle = meddle

    def chat(self, *args, **kwargs):
        if self.meddle is not None:
            self.meddle, meddle = None, self.meddle
            meddle()
        return super().chat(*args, **kwargs)


def test_an_episode_backdated_into_a_window_while_it_is_summarized_is_not_claimed(
    cli, conn, db_url, ollama_env, ollama
):
    from memctl import db
    from memctl.records import episodes

    Path(ollama_env["MEMCTL_CONFIG"]).write_text(CONFIG)
    load(cli, window_rows("ops", 40))
    settings = config.load(Path(ollama_env["MEMCTL_CONFIG"]))
    conn.use_settings(settings)
    added = []

    def backdate():
        with db.connect(db_url) as other:
            added.append(
                episodes.add(
                    other.use_settings(settings),
                    "Backdated meanwhile: the spare gateway was patched.",
                    kind="raw",
                    agent="ops",
                    source="agent:ops",
                    created_at=day_at(40, 7),
                )
            )

    result = summarize.run(conn, chat=_Meddling(ollama.url, backdate))
    assert [w["sources"] for w in result.written] == [10] and added[0] is not None
    summary_id = result.written[0]["summary_id"]
    assert (
        scalar(conn, "SELECT count(*) FROM summary_sources WHERE source_id = %s", (added[0],)) == 0
    )
    assert "Backdated meanwhile" not in scalar(
        conn, "SELECT content FROM episodes WHERE id = %s", (summary_id,)
    )
    addendum = summarize.run(conn, chat=chat.OllamaChat("llama3.2:3b", host=ollama.url))
    assert [w["sources"] for w in addendum.written] == [1]
    assert (
        scalar(conn, "SELECT summary_id FROM summary_sources WHERE source_id = %s", (added[0],))
        == addendum.written[0]["summary_id"]
    )


def test_a_source_deleted_while_its_window_is_summarized_fails_the_window(
    cli, conn, db_url, ollama_env, ollama
):
    from memctl import db

    Path(ollama_env["MEMCTL_CONFIG"]).write_text(CONFIG)
    load(cli, window_rows("ops", 40))
    settings = config.load(Path(ollama_env["MEMCTL_CONFIG"]))
    conn.use_settings(settings)

    def delete_one():
        with db.connect(db_url) as other:
            other.execute(
                "DELETE FROM episodes WHERE id = (SELECT min(id) FROM episodes WHERE agent = 'ops')"
            )

    result = summarize.run(conn, chat=_Meddling(ollama.url, delete_one))
    assert result.written == [] and len(result.failed) == 1
    assert "1 source episode(s) were deleted or changed" in result.failed[0]["error"]
    assert summaries(conn) == 0 and scalar(conn, "SELECT count(*) FROM summary_sources") == 0
    retry = summarize.run(conn, chat=chat.OllamaChat("llama3.2:3b", host=ollama.url))
    assert [w["sources"] for w in retry.written] == [9]


def test_the_already_summarized_rule_has_one_definition():
    """Every "some summary holds this episode" check composes memctl.records.lineage's fragment; none spells it out."""
    import re

    import memctl

    spelled = re.compile(
        r"FROM\s+summary_sources\s+\w+\s+WHERE\s+\w+\.agent\s*=\s*\w+\.agent\s+AND\s+"
        r"\w+\.source_id\s*=\s*\w+\.id",
        re.IGNORECASE,
    )
    found = {
        path.name: len(spelled.findall(path.read_text()))
        for path in Path(memctl.__file__).parent.rglob("*.py")
        if spelled.search(path.read_text())
    }
    assert found == {"lineage.py": 1}
    from memctl.records import lineage
    from memctl.retention import prune

    assert lineage.SUMMARIZED in prune.PRUNE_SUMMARIZED_WHERE
    assert lineage.UNSUMMARIZED in prune.PRUNE_UNSUMMARIZED_WHERE
    for statement in (
        summarize.WINDOWS,
        summarize.RECORD_INPUT,
        summarize.RECHECK,
        summarize.OVERDUE,
    ):
        assert lineage.SUMMARIZED in statement


# --- pure logic ----------------------------------------------------------------


def test_budget_caps_the_context_and_leaves_a_quarter_for_the_answer():
    budget = chat.Budget.for_model(131072, 4096)
    assert (budget.num_ctx, budget.num_predict, budget.prompt_room) == (4096, 1024, 3072)
    assert chat.Budget.for_model(2048, 4096).num_ctx == 2048
    assert chat.Budget.for_model(None, 8192).num_ctx == 8192
    assert (
        budget.user_room("x" * 400) == int(3072 * chat.ESTIMATE_SAFETY) - 100 - chat.MARGIN_TOKENS
    )
    with pytest.raises(config.ConfigError):
        chat.Budget.for_model(256, 4096)


def test_groups_pack_lines_in_order_within_the_room_and_split_nothing():
    lines = [f"line {i} " + "w" * (i * 37 % 200) for i in range(50)]
    packed = list(chat.groups(lines, 300))
    assert len(packed) > 1 and all(packed)
    assert [line for group in packed for line in group] == lines
    assert all(sum(chat.estimate_tokens(x) + 1 for x in g) <= 300 for g in packed if len(g) > 1)


def test_a_long_episode_goes_in_pieces_that_keep_every_word():
    text = " ".join(f"word{n}" for n in range(3000))
    episode = {"created_at": NOW, "source": "s", "content": text}
    lines = list(chat.episode_lines([episode], 500))
    assert len(lines) > 1 and all(chat.estimate_tokens(line) <= 500 for line in lines)
    assert " ".join(line.split(") ", 1)[1] for line in lines).split() == text.split()


class _Counted(str):
    """A str that counts the characters its slices, strips and searches touch: the work a split does."""

    work = 0

    def __getitem__(self, key):
        part = str.__getitem__(self, key)
        _Counted.work += len(part)
        return _Counted(part)

    def strip(self, chars=None):
        _Counted.work += len(self)
        return _Counted(str.strip(self, chars))

    def rfind(self, sub, start=0, end=None):
        _Counted.work += (len(self) if end is None else end) - start
        return str.rfind(self, sub, start, end)


def _split_work(text: str, size: int) -> tuple[list[str], int]:
    _Counted.work = 0
    pieces = chat._split(_Counted(text), size)
    return [str(p) for p in pieces], _Counted.work


def test_splitting_a_10_mb_text_is_linear_and_loses_no_character():
    import random

    rng = random.Random(7)
    vocabulary = [
        "".join(rng.choices("abcdefghij0123456789.:/", k=rng.randint(1, 40))) for _ in range(5000)
    ]
    text = " ".join(rng.choices(vocabulary, k=520_000))[:10_000_000].strip()
    size = 9000  # a part's room at num_ctx 4096, in characters
    pieces, work = _split_work(text, size)
    assert " ".join(pieces) == text  # every cut at a space: nothing lost, nothing added
    assert all(0 < len(p) <= size for p in pieces) and len(pieces) >= len(text) // size
    tenth, tenth_work = _split_work(text[:1_000_000], size)
    assert " ".join(tenth) == text[:1_000_000].strip()
    # Linear: the work is a few passes over the text, and ten times the text is about ten times the work (a
    # split that copies the remainder after each piece does ~len/size passes: ~1,100 here, and 100x the work).
    assert work <= 4 * len(text) and work / tenth_work < 12
    solid = "x" * 10_000_000  # no space to cut at: cut at the size, every character kept
    pieces, work = _split_work(solid, size)
    assert (
        "".join(pieces) == solid
        and {len(p) for p in pieces[:-1]} == {size}
        and work <= 4 * len(solid)
    )


@pytest.mark.parametrize(
    "text, why",
    [
        ("", "empty"),
        ("   ", "empty"),
        ("I'm sorry, but I can't help with that.", "refusal"),
        ("As an AI, I cannot summarize logs.", "refusal"),
        ("word " * 100, "longer than its input"),
        ("The input exceeds the context length of 4096 tokens.", "did not fit"),
    ],
)
def test_answers_that_are_no_summary_are_refused(text, why):
    budget = chat.Budget.for_model(4096, 4096)
    answer = chat.Answer(text.strip(), 100, 10, "stop")
    with pytest.raises(chat.WindowFailed, match=why):
        chat.check_answer(answer, "one two three four five six seven eight nine ten " * 3, budget)


def test_an_answer_cut_at_num_predict_or_read_truncated_is_refused():
    budget = chat.Budget.for_model(4096, 4096)
    user = "x " * 400
    with pytest.raises(chat.WindowFailed, match="cut at 1024"):
        chat.check_answer(chat.Answer("x.", 100, 1024, "length"), user, budget)
    with pytest.raises(chat.WindowFailed, match="truncated"):
        chat.check_answer(chat.Answer("x.", 4096, 2, "stop"), user, budget)
    assert chat.check_answer(chat.Answer("x y.", 3000, 2, "stop"), user, budget) == "x y."


def test_table_and_csv_output(cli, conn, setup):
    dry = cli("summarize", "--dry-run", "--agent", "ops")
    assert dry.exit_code == 0 and dry.stdout.splitlines()[0].split()[:5] == [
        "agent",
        "window_start",
        "window_end",
        "episodes",
        "tokens_in",
    ]
    out = cli("summarize", "--agent", "ops", "-f", "csv")
    assert out.exit_code == 0, out.stderr
    lines = out.stdout.splitlines()
    assert (
        lines[0] == "summary_id,agent,window_start,window_end,sources,tokens_in,tokens_out"
        and len(lines) == 7
    )
    assert "wrote 6 summaries" in out.stderr
