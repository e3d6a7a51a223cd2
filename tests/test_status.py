"""memctl status: counts, backlog, last runs, and the warnings `--check` turns into an exit code."""

from __future__ import annotations

from pathlib import Path

import pytest

from memctl.embedding import models
from memctl.observe import status

FIELDS = {
    "episodes",
    "chunks",
    "pending",
    "failed",
    "active_model",
    "oldest_pending_age_s",
    "last_embed",
    "last_prune",
    "warnings",
}


@pytest.fixture(autouse=True)
def fresh_memory(conn):
    """A memory created just now: a job that never ran is not late yet. The test database is made once per run,
    and a run slower than twice the embed schedule (10m) would otherwise see every never-run embed as late."""
    conn.execute("UPDATE memctl_migrations SET applied_at = now()")


def configure(memctl_env, text: str) -> None:
    Path(memctl_env["MEMCTL_CONFIG"]).write_text(text)


def run_job(conn, job: str, *, outcome: str = "ok", finished_ago: str = "1 minute") -> None:
    conn.execute(
        "INSERT INTO jobs (job, started_at, finished_at, outcome) "
        "VALUES (%s, now() - %s::interval - interval '1 second', now() - %s::interval, %s)",
        (job, finished_ago, finished_ago, outcome),
    )


def check(cli) -> tuple[int, dict, str]:
    out = cli("status", "--check", "-f", "json")
    return out.exit_code, out.json(), out.stderr


def test_a_fresh_database_has_no_warnings(cli):
    code, report, stderr = check(cli)
    assert code == 0 and report["warnings"] == [] and "warning" not in stderr
    assert FIELDS <= set(report)
    assert (report["episodes"], report["chunks"], report["pending"], report["failed"]) == (
        0,
        0,
        0,
        0,
    )


def test_a_never_run_embed_with_pending_chunks_warns_until_embed_runs(cli):
    assert cli("episode", "add", "the deploy failed: disk full").exit_code == 0
    code, report, stderr = check(cli)
    assert code == 1
    assert len(report["warnings"]) == 1 and "embed has never run" in report["warnings"][0]
    assert "warning: embed has never run" in stderr
    assert cli("status").exit_code == 0  # without --check the warning is talk, not a failure
    assert cli("embed").exit_code == 0
    code, report, _ = check(cli)
    assert (code, report["warnings"], report["pending"]) == (0, [], 0)
    assert report["last_embed"]["outcome"] == "ok"


def test_a_late_embed_warns_relative_to_its_schedule(cli, conn, memctl_env):
    run_job(conn, "embed", finished_ago="20 minutes")  # default schedule 5m: late after 10m
    code, report, _ = check(cli)
    assert code == 1 and "last successful embed finished 20." in report["warnings"][0]
    configure(memctl_env, '[schedule]\nembed = "15m"\n')
    assert check(cli)[0] == 0


def test_a_recent_failed_run_does_not_hide_an_old_success(cli, conn):
    run_job(conn, "embed", finished_ago="2 hours")
    run_job(conn, "embed", outcome="unavailable", finished_ago="1 minute")
    code, report, _ = check(cli)
    assert code == 1 and "last successful embed finished 2.0h ago" in report["warnings"][0]


def test_a_failed_last_embed_fails_the_check_until_a_run_completes(cli, conn):
    assert cli("episode", "add", "the deploy failed: disk full").exit_code == 0
    run_job(conn, "embed", finished_ago="3 minutes")  # recent enough: not late
    run_job(conn, "embed", outcome="unavailable", finished_ago="1 minute")
    conn.execute(
        "UPDATE jobs SET error = 'ollama unreachable at http://127.0.0.1:11434' WHERE outcome = 'unavailable'"
    )
    code, report, stderr = check(cli)
    assert code == 1 and report["warnings"] == [
        "the last embed run ended unavailable: ollama unreachable at http://127.0.0.1:11434; 1 chunk(s) wait for "
        "vectors (memctl jobs --job embed)"
    ]
    assert "warning: the last embed run ended unavailable" in stderr
    run_job(conn, "embed", finished_ago="10 seconds")
    assert check(cli)[0] == 0


def test_an_old_embedding_backlog_warns(cli, conn):
    assert cli("embed").exit_code == 0  # registers the model, nothing pending yet
    assert cli("episode", "add", "a fresh memory").exit_code == 0
    assert check(cli)[0] == 0
    conn.execute("UPDATE embed_queue SET enqueued_at = now() - interval '3 hours'")
    code, report, _ = check(cli)
    assert code == 1 and report["pending"] == 1
    assert any(
        "oldest chunk waiting for a vector was queued 3.0h ago" in w for w in report["warnings"]
    )


def test_failed_chunks_warn(cli, conn):
    assert cli("episode", "add", "a memory the model refuses").exit_code == 0
    assert cli("embed").exit_code == 0
    model = models.active(conn)
    conn.execute(
        "INSERT INTO embed_failures (model_id, agent, chunk_id, error) "
        "SELECT %s, agent, id, 'input too long' FROM chunks",
        (model.id,),
    )
    code, report, _ = check(cli)
    assert code == 1 and report["failed"] == 1
    assert any("1 chunk(s) were refused" in w for w in report["warnings"])


def test_prune_warnings_follow_the_retention_policy_and_schedule(cli, conn, memctl_env):
    assert check(cli)[0] == 0  # no policy, never pruned: nothing to warn about
    configure(memctl_env, '[retention]\nraw = "30d"\n')
    code, report, _ = check(cli)
    assert (
        code == 1
        and "prune has never run although a retention policy is set" in report["warnings"][0]
    )
    assert cli("prune", "--yes").exit_code == 0
    assert check(cli)[0] == 0
    conn.execute("DELETE FROM jobs")
    run_job(conn, "prune", finished_ago="3 days")  # default schedule 1d: late after 2d
    code, report, _ = check(cli)
    assert code == 1 and "last successful prune finished 3.0d ago" in report["warnings"][0]
    configure(memctl_env, '[retention]\nraw = "30d"\n[schedule]\nprune = "2d"\n')
    assert check(cli)[0] == 0


def test_a_prune_that_never_completed_says_how_it_ended(cli, conn, memctl_env):
    configure(memctl_env, '[retention]\nraw = "30d"\n')
    conn.execute(
        "INSERT INTO jobs (job, finished_at, outcome, error) VALUES ('prune', now(), 'failed', 'disk full')"
    )
    code, report, _ = check(cli)
    assert code == 1 and report["warnings"] == [
        "prune has never completed a run: the last one ended failed (disk full) (memctl jobs --job prune)"
    ]


def test_collect_without_settings_uses_the_default_schedules(conn):
    run_job(conn, "embed", finished_ago="1 hour")
    report = status.collect(conn)
    assert len(report["warnings"]) == 1 and "embed" in report["warnings"][0]
    assert (
        status.human(90) == "1.5m"
        and status.human(30) == "30s"
        and status.human(3 * 86400) == "3.0d"
    )


def test_backups_are_watched_once_one_has_run(cli, conn, memctl_env):
    code, report, _ = check(cli)
    assert (
        code == 0 and report["last_backup"] is None and report["last_backup_age_s"] is None
    )  # never: no warning
    run_job(conn, "backup", finished_ago="1 hour")
    code, report, _ = check(cli)
    assert (
        code == 0
        and report["last_backup"]["outcome"] == "ok"
        and 3500 < report["last_backup_age_s"] < 3700
    )
    conn.execute("DELETE FROM jobs")
    run_job(conn, "backup", finished_ago="3 days")  # default schedule 1d: overdue after 2d
    code, report, stderr = check(cli)
    assert code == 1 and report["warnings"] == [
        "the last successful backup finished 3.0d ago, more than twice its schedule (1d, [schedule] backup): "
        "is memctl-backup.timer running? (memctl jobs --job backup)"
    ]
    assert "warning: the last successful backup finished 3.0d ago" in stderr
    configure(memctl_env, '[schedule]\nbackup = "2d"\n')
    assert check(cli)[0] == 0
    run_job(conn, "backup", outcome="failed", finished_ago="1 minute")
    conn.execute("UPDATE jobs SET error = 'pg_dump failed: disk full' WHERE outcome = 'failed'")
    code, report, _ = check(cli)
    assert code == 1 and report["warnings"] == [
        "the last backup run ended failed: pg_dump failed: disk full (memctl jobs --job backup)"
    ]


def test_a_backup_and_prune_that_never_ran_warn_once_the_memory_is_older_than_twice_their_schedule(
    cli, conn
):
    """Issue 40: a timer never enabled is as late as one that stopped (status --check and MemctlJobLate)."""
    assert check(cli)[0] == 0  # a memory created just now: nothing is late yet
    conn.execute("UPDATE memctl_migrations SET applied_at = applied_at - interval '3 days'")
    run_job(conn, "embed")
    code, report, _ = check(cli)
    assert code == 1, report
    late = {w.split()[0]: w for w in report["warnings"]}
    assert set(late) == {"prune", "backup"}, report["warnings"]
    assert "has never run, and this memory was created 3.0d ago" in late["backup"]
    assert "memctl-backup.timer" in late["backup"] and "memctl prune --yes" in late["prune"]
    run_job(conn, "backup")
    run_job(conn, "prune")
    assert check(cli)[0] == 0
