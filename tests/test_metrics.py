"""memctl metrics: the Prometheus text, the textfile, the shipped alert rules, and a real node_exporter.

promtool and prometheus-node-exporter are Debian's packages (README, Tests): a test that needs one is skipped,
saying so, where it is missing, and no CI step expects that skip, so with CI set it fails (tests/fix_ci.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from memctl.observe import metrics as metrics_mod

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "prometheus" / "memctl.rules.yml"
RULE_TESTS = ROOT / "prometheus" / "memctl.rules.test.yml"
NODE_EXPORTER = "prometheus-node-exporter"


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:  # no CI step expects this skip (tests/fix_ci.py): with CI set, it fails
        pytest.skip(
            f"{name} is not installed (apt-get install prometheus prometheus-node-exporter)"
        )
    return found


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, labels): value} of a Prometheus text exposition."""
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, frozenset(s.labels.items()))] = s.value
    return found


def value(found: dict, name: str, **labels) -> float | None:
    return found.get((name, frozenset(labels.items())))


def configure(memctl_env, text: str) -> None:
    Path(memctl_env["MEMCTL_CONFIG"]).write_text(text)


def metrics(cli) -> dict:
    out = cli("metrics")
    assert out.exit_code == 0, out.stderr
    return samples(out.stdout)


# --- the text ----------------------------------------------------------------------------------------------


def test_counts_backlog_and_the_embed_run_match_status(cli, conn):
    for kind, text in (
        ("raw", "disk full on db1"),
        ("raw", "nginx logs rotated"),
        ("decision", "use pgvector"),
    ):
        assert cli("episode", "add", text, "--kind", kind, "--agent", "ops").exit_code == 0
    found = metrics(cli)
    status = cli("status", "-f", "json").json()
    assert (
        value(found, "memctl_embed_pending") == status["pending"] == 3
    )  # no model yet: every chunk waits
    assert (
        value(found, "memctl_episodes", kind="raw") == 2
        and value(found, "memctl_episodes", kind="decision") == 1
    )
    assert value(found, "memctl_chunks", kind="raw") == 2
    assert value(found, "memctl_agent_episodes", agent="ops") == 3
    assert value(found, "memctl_groups_sample_ratio") == 1
    assert value(found, "memctl_up") == 1
    assert (
        value(found, "memctl_status_warnings") == len(status["warnings"]) == 1
    )  # embed has never run
    assert value(found, "memctl_job_runs", job_name="embed", outcome="ok") == 0
    # a scheduled job that never ran is late from the memory's creation, so MemctlJobLate fires for a timer never
    # enabled once the memory is older than twice its schedule (and not at the first scrape of a fresh install)
    created = conn.execute(
        "SELECT extract(epoch FROM min(applied_at)) AS t FROM memctl_migrations"
    ).fetchone()["t"]
    for job in ("embed", "summarize", "prune", "backup"):
        assert value(
            found, "memctl_job_last_success_timestamp_seconds", job_name=job
        ) == pytest.approx(float(created), abs=1e-3), job

    assert cli("embed").exit_code == 0
    assert cli("episode", "add", "a fresh memory", "--agent", "ops").exit_code == 0
    found = metrics(cli)
    status = cli("status", "-f", "json").json()
    assert value(found, "memctl_embed_pending") == status["pending"] == 1
    assert value(found, "memctl_embed_oldest_pending_age_seconds") >= 0
    assert value(found, "memctl_job_runs", job_name="embed", outcome="ok") == 1
    assert value(found, "memctl_job_last_outcome", job_name="embed", outcome="ok") == 1
    assert value(found, "memctl_job_last_outcome", job_name="embed", outcome="failed") == 0
    assert value(found, "memctl_job_last_rows", job_name="embed") == 3
    assert value(found, "memctl_job_consecutive_failures", job_name="embed") == 0
    assert (
        abs(
            value(found, "memctl_job_last_success_timestamp_seconds", job_name="embed")
            - time.time()
        )
        < 600
    )
    assert value(found, "memctl_job_schedule_seconds", job_name="embed") == 300
    assert value(found, "memctl_job_schedule_seconds", job_name="purge") is None  # no timer
    model = {
        dict(labels)["model"]: dict(labels)
        for (name, labels), _ in found.items()
        if name == "memctl_embedding_model_info"
    }
    assert model["hash-embed"]["state"] == "active" and model["hash-embed"]["embedder"] == "hash"
    vectors = [
        dict(labels)
        for (name, labels), v in found.items()
        if name == "memctl_database_bytes" and ("group", "vectors") in labels and v > 0
    ]
    assert {(v["model"], v["model_id"]) for v in vectors} == {
        ("hash:hash-embed", model["hash-embed"]["model_id"])
    }


def test_bytes_by_group_are_memctl_sizes_relations(cli):
    assert cli("episode", "add", "disk full on db1").exit_code == 0
    assert cli("embed").exit_code == 0
    found = metrics(cli)
    relations = cli("size", "--section", "relations", "-f", "json").json()
    tables = [r for r in relations if r["kind"] in ("table", "vectors")]
    total = sum(v for (name, _), v in found.items() if name == "memctl_database_bytes")
    assert total == sum(r["total_bytes"] for r in tables)
    indexes = sum(
        v
        for (name, labels), v in found.items()
        if name == "memctl_database_bytes" and ("part", "indexes") in labels
    )
    assert indexes == sum(r["index_bytes"] for r in tables)
    episodes = next(r for r in tables if r["relation"].endswith(".episodes"))
    assert (
        value(found, "memctl_database_bytes", group="episodes", part="data")
        == episodes["total_bytes"] - episodes["index_bytes"]
    )


def test_agents_past_the_limit_are_summed_as_other(cli, memctl_env):
    for agent, n in (("a", 4), ("b", 3), ("c", 2), ("d", 1)):
        for i in range(n):
            assert cli("episode", "add", f"note {i} of {agent}", "--agent", agent).exit_code == 0
    configure(memctl_env, "[metrics]\nagents = 2\n")
    found = metrics(cli)
    agents = {
        dict(labels)["agent"]: v
        for (name, labels), v in found.items()
        if name == "memctl_agent_episodes"
    }
    assert agents == {"a": 4, "b": 3, "other": 3}
    configure(memctl_env, "[metrics]\nagents = 0\n")
    agents = {
        dict(labels)["agent"]: v
        for (name, labels), v in metrics(cli).items()
        if name == "memctl_agent_episodes"
    }
    assert agents == {"other": 10}


def test_past_sample_rows_kinds_and_agents_come_from_a_sample_scaled_to_the_exact_total(
    cli, monkeypatch
):
    lines = "".join(
        json.dumps(
            {
                "content": f"note {i}: " + "disk full on db1, logs rotated " * 4,
                "kind": "raw",
                "agent": "ops",
            }
        )
        + "\n"
        for i in range(400)
    )
    assert cli("episode", "import", "-", input=lines).exit_code == 0
    monkeypatch.setattr(metrics_mod, "SAMPLE_ROWS", 100)
    found = metrics(cli)
    assert 0 < value(found, "memctl_groups_sample_ratio") < 1  # some pages of episodes, not all
    assert (
        value(found, "memctl_episodes", kind="raw")
        == value(found, "memctl_agent_episodes", agent="ops")
        == 400
    )
    assert value(found, "memctl_chunks", kind="raw") == 400  # one chunk each, scaled alike


def test_bounded_merges_a_real_agent_named_other():
    rows = [
        {"agent": "other", "episodes": 5, "chunks": 5},
        {"agent": "x", "episodes": 1, "chunks": 2},
    ]
    assert metrics_mod.bounded(rows, "agent", 1, ("episodes", "chunks")) == [
        {"agent": "other", "episodes": 6, "chunks": 7}
    ]


def test_failures_in_a_row_last_duration_and_runs_by_outcome(cli, conn):
    def run(outcome: str, ago: int, seconds: int = 2) -> None:
        conn.execute(
            "INSERT INTO jobs (job, started_at, finished_at, outcome, rows) VALUES "
            "('prune', now() - make_interval(mins => %s) - make_interval(secs => %s), "
            "now() - make_interval(mins => %s), %s, 7)",
            (ago, seconds, ago, outcome),
        )

    run("failed", 50)
    run("ok", 40, seconds=12)
    run("failed", 30)
    run("unavailable", 20)
    run("failed", 10, seconds=3)
    found = metrics(cli)
    assert value(found, "memctl_job_consecutive_failures", job_name="prune") == 3
    assert value(found, "memctl_job_runs", job_name="prune", outcome="failed") == 3
    assert value(found, "memctl_job_runs", job_name="prune", outcome="unavailable") == 1
    assert value(found, "memctl_job_last_outcome", job_name="prune", outcome="failed") == 1
    assert value(found, "memctl_job_last_duration_seconds", job_name="prune") == pytest.approx(
        3, abs=0.01
    )
    success = value(found, "memctl_job_last_success_timestamp_seconds", job_name="prune")
    assert abs(time.time() - 40 * 60 - success) < 60
    run("partial", 5)
    assert value(metrics(cli), "memctl_job_consecutive_failures", job_name="prune") == 0


def test_an_idle_embed_streak_counts_no_duration(cli, conn):
    assert cli("embed").exit_code == 0  # registers the model; nothing to embed: an idle row
    conn.execute("UPDATE jobs SET started_at = now() - interval '3 hours'")
    assert cli("embed").exit_code == 0  # the streak's row moves forward
    found = metrics(cli)
    assert value(found, "memctl_job_last_duration_seconds", job_name="embed") == 0


def test_summaries_overdue_are_counted_only_when_summaries_are_on(cli, memctl_env):
    assert (
        cli(
            "episode", "add", "an old note", "--kind", "raw", "--created-at", "2020-01-01T00:00:00Z"
        ).exit_code
        == 0
    )
    assert value(metrics(cli), "memctl_summaries_overdue_episodes") is None
    configure(memctl_env, '[retention]\nraw = "30d"\n[summarize]\nmodel = "llama3.2:3b"\n')
    found = metrics(cli)
    assert value(found, "memctl_summaries_overdue_episodes") == 1
    assert value(found, "memctl_job_schedule_seconds", job_name="summarize") == 86400
    status = cli("status", "-f", "json").json()
    assert any("summaries are overdue: 1 episode(s)" in w for w in status["warnings"])


def test_the_info_metric_names_version_and_schema(cli):
    import memctl
    from memctl.db import migrate

    found = metrics(cli)
    info = [dict(labels) for (name, labels), _ in found.items() if name == "memctl_info"]
    assert len(info) == 1 and info[0]["version"] == memctl.__version__
    assert info[0]["schema"] == migrate.read_files()[-1].name.removesuffix(".sql")
    assert info[0]["postgresql"] and info[0]["pgvector"]


def test_promtool_check_metrics_passes(cli):
    promtool = tool("promtool")
    assert cli("episode", "add", "disk full on db1").exit_code == 0
    assert cli("embed").exit_code == 0
    out = cli("metrics")
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=out.stdout.encode(), capture_output=True
    )
    assert checked.returncode == 0 and checked.stdout == b"" and checked.stderr == b"", checked


# --- the textfile ------------------------------------------------------------------------------------------


def test_the_textfile_is_written_whole_and_refused_where_node_exporter_would_not_read(
    cli, tmp_path
):
    path = tmp_path / "memctl.prom"
    out = cli("metrics", "--textfile", str(path))
    assert out.exit_code == 0 and out.stdout == ""
    assert value(samples(path.read_text()), "memctl_up") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.toml",
        "memctl.prom",
    ]  # no temporary left
    previous = os.umask(0o077)  # as the units run: node_exporter's user must still read the file
    try:
        assert cli("metrics", "--textfile", str(path)).exit_code == 0
    finally:
        os.umask(previous)
    assert path.stat().st_mode & 0o777 == 0o644
    wrong = cli("metrics", "--textfile", str(tmp_path / "memctl.txt"))
    assert wrong.exit_code == 2 and "ending in .prom" in wrong.stderr
    missing = cli("metrics", "--textfile", str(tmp_path / "nowhere" / "memctl.prom"))
    assert missing.exit_code == 1 and "no directory" in missing.stderr


def test_an_unreachable_database_writes_up_0(cli, tmp_path, free_port):
    path = tmp_path / "memctl.prom"
    url = f"postgresql://memctl:secret@127.0.0.1:{free_port}/memctl"
    out = cli("--database-url", url, "metrics", "--textfile", str(path))
    assert out.exit_code == 3 and "secret" not in out.stderr
    found = samples(path.read_text())
    assert value(found, "memctl_up") == 0 and value(found, "memctl_embed_pending") is None


# --- the shipped rules ------------------------------------------------------------------------------------


def test_the_rules_pass_promtool_check_and_their_unit_tests():
    promtool = tool("promtool")
    checked = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True
    )
    assert checked.returncode == 0 and "SUCCESS: 9 rules found" in checked.stdout, checked
    tested = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name],
        capture_output=True,
        text=True,
        cwd=RULE_TESTS.parent,
    )
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def test_every_rule_has_a_unit_test_that_fires_it():
    rules = set(re.findall(r"^\s+- alert: (\w+)$", RULES.read_text(), flags=re.MULTILINE))
    fired = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts:\n", RULE_TESTS.read_text()))
    quiet = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts: \[\]\n", RULE_TESTS.read_text()))
    assert len(rules) == 9 and rules == fired == quiet


def test_metrics_rules_prints_the_shipped_file(cli):
    out = cli("metrics", "--rules")
    assert out.exit_code == 0 and out.stdout == RULES.read_text()
    assert metrics_mod.rules_text() == RULES.read_text()


# --- a real node_exporter ----------------------------------------------------------------------------------


@pytest.fixture
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def node_exporter(tmp_path):
    """node_exporter on loopback, its textfile collector reading a directory of ours: (directory, scrape)."""
    exe = tool(NODE_EXPORTER)
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    for _ in range(5):  # a port taken between choosing it and binding it: choose again
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen(
            [
                exe,
                f"--web.listen-address=127.0.0.1:{port}",
                "--collector.disable-defaults",
                "--collector.textfile",
                f"--collector.textfile.directory={textfiles}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        if _ready(proc, port):
            break
        proc.kill()
        proc.wait()
    else:
        pytest.fail("node_exporter did not start on loopback")

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            return response.read().decode()

    try:
        yield textfiles, scrape
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _ready(proc: subprocess.Popen, port: int, seconds: float = 15) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def test_node_exporter_serves_what_a_timer_run_wrote(memctl_bin, ollama_env, ollama, node_exporter):
    textfiles, scrape = node_exporter
    path = str(textfiles / "memctl.prom")

    def timer_run(*job: str) -> int:
        """What a job unit runs: ExecStart=, then ExecStopPost=-memctl metrics --textfile PATH."""
        code = memctl_bin(*job).exit_code
        assert memctl_bin("metrics", "--textfile", path).exit_code == 0
        return code

    for text in ("disk full on db1", "nginx logs rotated", "replica lag on db2"):
        assert memctl_bin("episode", "add", text).exit_code == 0
    assert timer_run("embed") == 0
    assert memctl_bin("episode", "add", "certificate renewal failed").exit_code == 0
    assert timer_run("prune") == 0
    found = samples(scrape())
    status = memctl_bin("status", "-f", "json").json()
    assert value(found, "memctl_embed_pending") == status["pending"] == 1
    assert value(found, "memctl_job_last_outcome", job_name="embed", outcome="ok") == 1
    assert value(found, "memctl_episodes", kind="observation") == 4
    assert value(found, "node_textfile_scrape_error") == 0

    ollama.down()  # the embedder unreachable: the run ends unavailable, the chunk stays pending
    assert timer_run("embed") == 3
    found = samples(scrape())
    assert value(found, "memctl_job_last_outcome", job_name="embed", outcome="unavailable") == 1
    assert value(found, "memctl_job_runs", job_name="embed", outcome="unavailable") == 1
    assert value(found, "memctl_job_consecutive_failures", job_name="embed") == 1
    assert (
        value(found, "memctl_embed_pending")
        == memctl_bin("status", "-f", "json").json()["pending"]
        == 1
    )
    assert value(found, "node_textfile_scrape_error") == 0
