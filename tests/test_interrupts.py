"""SIGINT and SIGTERM mid-run, to the installed `memctl` binary, for every long command (memctl.interrupts).

One declaration (LONG) generates the matrix: each command with each signal. Every run is caught mid-run by
what it has done, never by a guessed sleep: a lock this test holds stops it inside its transaction (a COPY
with its first rows written, a delete after whole batches committed, pg_dump or psql in its snapshot), or the
work it committed is seen (a batch of vectors, a summary, a stored line, a line of output). Then the signal:
the command stops (exit 128 + the signal), its memory is as before or holds only whole units (as README's
exit codes and docs/systemd.md say, per command), a logged job ends 'interrupted', and no traceback is printed.

Every child starts with SIGINT ignored, as a background job of a non-interactive shell does: `kill -INT` must
stop memctl there too.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psycopg
import pytest

from tests.conftest import fresh_database

NOW = datetime.datetime.now(datetime.timezone.utc)
WAITING = """SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
             AND wait_event_type = 'Lock' {also}"""


def _memctl() -> str:
    beside = Path(sys.executable).parent / "memctl"
    return str(beside) if beside.exists() else shutil.which("memctl")


@dataclass
class Run:
    """What a case works with: the in-process CLI to prepare, a connection to look, the child's environment."""

    cli: Callable
    conn: object
    env: dict
    tmp: Path
    ollama: object
    db_url: str
    pg_server: str
    holder: object = None  # a second connection holding the lock that stops the command mid-run
    proc: subprocess.Popen | None = None
    before: dict = field(default_factory=dict)

    def count(self, query: str, params=None) -> int:
        return next(iter(self.conn.execute(query, params).fetchone().values()))

    def hold(self, statement: str) -> None:
        """Open a transaction on a second connection and take a lock in it, kept until the run is over."""
        self.holder = psycopg.connect(self.db_url)
        self.holder.execute(statement)

    def waiting(self, also: str = "") -> bool:
        return self.count(WAITING.format(also=also)) > 0


def import_lines(
    run: Run, n: int, *, source: str = "app", days_old: int = 0, kind: str = "raw"
) -> None:
    rows = [
        json.dumps(
            {
                "content": f"event {i} of {source}: worker {i % 7} restarted after error E{i}",
                "source": source,
                "kind": kind,
                "created_at": (NOW - datetime.timedelta(days=days_old, minutes=n - i)).isoformat(),
            }
        )
        for i in range(n)
    ]
    out = run.cli("episode", "import", "-", input="\n".join(rows) + "\n")
    assert out.exit_code == 0, out.stderr


def episodes(run: Run, source: str | None = None) -> int:
    if source is None:
        return run.count("SELECT count(*) FROM episodes")
    return run.count("SELECT count(*) FROM episodes WHERE source = %s", (source,))


# --- the commands ------------------------------------------------------------------------------------------


def _episode_import(run: Run) -> list[str]:
    path = run.tmp / "in.jsonl"
    path.write_text(
        "".join(
            json.dumps({"content": f"imported line {i}", "source": "file"}) + "\n"
            for i in range(2000)
        )
    )
    run.hold(
        "LOCK TABLE chunks IN SHARE MODE"
    )  # the episodes of the first batch are copied, its chunks wait
    return ["episode", "import", str(path)]


def _copying(run: Run) -> bool:
    return run.waiting("AND query LIKE '%COPY chunks%'")


def _nothing_imported(run: Run) -> None:
    assert episodes(run, "file") == 0  # one transaction: none of it


def _transfer_import(run: Run) -> list[str]:
    path = run.tmp / "export.jsonl"
    with fresh_database(run.pg_server) as other:
        env = {**run.env, "MEMCTL_DATABASE_URL": other}
        rows = "".join(
            json.dumps({"content": f"exported episode {i}", "source": "file"}) + "\n"
            for i in range(2000)
        )
        for argv, data in (
            (["episode", "import", "-"], rows.encode()),
            (["export", "--out", str(path)], None),
        ):
            done = subprocess.run(
                [_memctl(), *argv], env=env, input=data, capture_output=True, timeout=120
            )
            assert done.returncode == 0, done.stderr
    run.hold("LOCK TABLE chunks IN SHARE MODE")
    return ["import", str(path)]


def _export(run: Run) -> list[str]:
    import_lines(run, 1500)  # far more than a pipe holds: export blocks on its output, mid-stream
    return ["export"]


def _first_line(run: Run) -> bool:
    return bool(run.proc.stdout.readline())


def _unchanged(run: Run) -> None:
    assert episodes(run) == run.before["episodes"]


def _backup(run: Run) -> list[str]:
    run.cli("fact", "set", "db.host", "10.8.0.4")
    run.before["dir"] = run.tmp / "backups"
    run.hold(
        "LOCK TABLE facts IN ACCESS EXCLUSIVE MODE"
    )  # the snapshot's checksums and pg_dump wait for it
    return ["backup", "--to", str(run.before["dir"])]


def _no_backup_left(run: Run) -> None:
    left = list(run.before["dir"].iterdir()) if run.before["dir"].exists() else []
    assert left == [], f"a backup interrupted left {left}"
    assert _gone(run, "pg_dump"), "pg_dump still at work"


def _gone(run: Run, program: str) -> bool:
    """No session of PROGRAM left (a killed client's backend ends once the lock it waited for is released)."""
    deadline = time.monotonic() + 30
    while run.count(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (program,)
    ):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _restore(run: Run) -> list[str]:
    run.cli("fact", "set", "db.host", "10.8.0.4")
    made = run.cli("backup", "--to", str(run.tmp / "backups"), "-f", "json")
    assert made.exit_code == 0, made.stderr
    run.cli("fact", "set", "db.host", "10.8.0.9")  # after the backup: a restore would take it back
    run.hold(
        "LOCK TABLE facts IN ACCESS SHARE MODE"
    )  # pg_dump (the safety backup) reads; psql's DROP waits
    return ["restore", made.json()["file"], "--yes"]


def _restoring(run: Run) -> bool:
    return run.waiting("AND application_name = 'psql'")


def _not_restored(run: Run) -> None:
    assert run.count("SELECT value FROM facts WHERE key = 'db.host'") == "10.8.0.9"


def _slow_embedder(run: Run, n: int = 40) -> None:
    run.env.update(
        {
            "MEMCTL_EMBEDDER": "ollama",
            "MEMCTL_EMBED_MODEL": "all-minilm",
            "OLLAMA_HOST": run.ollama.url,
        }
    )
    import_lines(run, n)
    run.before["chunks"] = run.count("SELECT count(*) FROM chunks")
    run.ollama.inject(
        "slow", delay_s=0.3
    )  # every request takes a while: the signal lands inside a batch


def _embed(run: Run) -> list[str]:
    _slow_embedder(run)
    return ["embed", "--batch-size", "4"]


def _vectors(run: Run) -> int:
    from memctl.embedding import models

    return sum(
        run.count("SELECT count(*) FROM " + m.table_name) for m in models.all_models(run.conn)
    )


def _embedding(run: Run) -> bool:
    return _vectors(run) > 0


def _whole_batches(run: Run) -> None:
    done = _vectors(run) - run.before.get("vectors", 0)
    queued = run.count("SELECT count(*) FROM embed_queue")
    assert 0 < done < run.before["chunks"] and done % 4 == 0, done  # whole batches of 4
    assert done + queued == run.before["chunks"]  # nothing lost


def _reembed(run: Run) -> list[str]:
    run.env.update(
        {
            "MEMCTL_EMBEDDER": "ollama",
            "MEMCTL_EMBED_MODEL": "all-minilm",
            "OLLAMA_HOST": run.ollama.url,
        }
    )
    import_lines(run, 40)
    done = subprocess.run([_memctl(), "embed"], env=run.env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    started = subprocess.run(
        [_memctl(), "reembed", "start", "--model", "nomic-embed-text"],
        env=run.env,
        capture_output=True,
        timeout=120,
    )
    assert started.returncode == 0, started.stderr
    run.before.update(chunks=run.count("SELECT count(*) FROM chunks"), vectors=_vectors(run))
    run.ollama.inject("slow", delay_s=0.3)
    return ["reembed", "run", "--batch-size", "4"]


def _reembedding(run: Run) -> bool:
    return _vectors(run) > run.before["vectors"]


def _old_episodes(run: Run, source: str) -> None:
    """100 episodes 40 days old in time order; the 55th locked: deleting in batches of 10, five batches commit
    and the sixth waits for it."""
    import_lines(run, 100, source=source, days_old=40)
    middle = run.conn.execute(
        "SELECT id FROM episodes ORDER BY created_at, id OFFSET 54 LIMIT 1"
    ).fetchone()["id"]
    run.hold(f"SELECT 1 FROM episodes WHERE id = {int(middle)} FOR UPDATE")


def _prune(run: Run) -> list[str]:
    Path(run.env["MEMCTL_CONFIG"]).write_text('[retention]\nraw = "30d"\n')
    _old_episodes(run, "app")
    return ["prune", "--yes", "--batch-size", "10"]


def _purge(run: Run) -> list[str]:
    _old_episodes(run, "noisy")
    return ["purge", "--source", "noisy", "--yes", "--batch-size", "10"]


def _deleting(run: Run) -> bool:
    return run.waiting() and episodes(run) < 100


def _fifty_deleted(run: Run) -> None:
    assert episodes(run) == 50  # the five batches before the lock, whole; the sixth rolled back


def _summarize(run: Run) -> list[str]:
    run.env.update(
        {
            "MEMCTL_EMBEDDER": "ollama",
            "MEMCTL_EMBED_MODEL": "all-minilm",
            "OLLAMA_HOST": run.ollama.url,
        }
    )
    Path(run.env["MEMCTL_CONFIG"]).write_text(
        '[retention]\nraw = "30d"\n\n[summarize]\nmodel = "llama3.2:3b"\n'
    )
    for days in (40, 45, 50):  # three windows: one UTC day each
        import_lines(run, 5, source=f"day{days}", days_old=days)
    run.ollama.delay_s = 120
    run.ollama.inject_answer(
        "hang", after=1
    )  # the first window's answer comes, the second's is held
    return ["summarize"]


def _summaries(run: Run) -> int:
    return run.count("SELECT count(*) FROM episodes WHERE kind = 'summary'")


def _summarizing(run: Run) -> bool:
    return _summaries(run) == 1 and len(run.ollama.chat_requests()) >= 2


def _one_summary(run: Run) -> None:
    assert _summaries(run) == 1  # the window in flight rolled back; the one before it stays, whole


def _ingest(run: Run) -> list[str]:
    return ["ingest", "--source", "app", "--flush", "3600", "--group", "blank"]


def _ingesting(run: Run) -> bool:
    if not run.before.get("fed"):
        run.proc.stdin.write(b"first line\nsecond line\n\n")
        run.proc.stdin.flush()
        run.before["fed"] = True
    if episodes(run) == 0:
        return False
    run.proc.stdin.write(b"third line\nfourth line\n")  # a group still open: read, not yet stored
    run.proc.stdin.flush()
    return True


def _all_read_stored(run: Run) -> None:
    texts = [r["content"] for r in run.conn.execute("SELECT content FROM episodes ORDER BY id")]
    assert texts == ["first line\nsecond line", "third line\nfourth line"]


@dataclass(frozen=True)
class Long:
    """A long command: how to start it, how to see it is mid-run, what its memory holds after, its job's name."""

    start: Callable[[Run], list[str]]
    midway: Callable[[Run], bool]
    after: Callable[[Run], None]
    job: str | None
    stdin: bool = False


LONG = {
    "episode import": Long(_episode_import, _copying, _nothing_imported, None),
    "import": Long(_transfer_import, _copying, _nothing_imported, None),
    "export": Long(_export, _first_line, _unchanged, "export"),
    "backup": Long(_backup, lambda run: run.waiting(), _no_backup_left, "backup"),
    "restore": Long(_restore, _restoring, _not_restored, "restore"),
    "embed": Long(_embed, _embedding, _whole_batches, "embed"),
    "reembed": Long(_reembed, _reembedding, _whole_batches, "reembed"),
    "prune": Long(_prune, _deleting, _fifty_deleted, "prune"),
    "purge": Long(_purge, _deleting, _fifty_deleted, "purge"),
    "summarize": Long(_summarize, _summarizing, _one_summary, "summarize"),
    "ingest": Long(_ingest, _ingesting, _all_read_stored, None, stdin=True),
}
SIGNALS = {"SIGINT": (signal.SIGINT, 130), "SIGTERM": (signal.SIGTERM, 143)}


@pytest.mark.parametrize("sig", SIGNALS)
@pytest.mark.parametrize("command", LONG)
def test_a_signal_mid_run_stops_the_command_and_keeps_memory_whole(
    command, sig, cli, conn, memctl_env, db_url, pg_server, ollama, tmp_path
):
    case, (signum, code) = LONG[command], SIGNALS[sig]
    run = Run(cli, conn, dict(os.environ, **memctl_env), tmp_path, ollama, db_url, pg_server)
    try:
        argv = case.start(run)
        run.before.setdefault("episodes", episodes(run))
        run.proc = subprocess.Popen(
            [_memctl(), *argv],
            env=run.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.PIPE if case.stdin else subprocess.DEVNULL,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
        deadline = time.monotonic() + 60
        while not case.midway(run):
            assert run.proc.poll() is None, (
                f"{command} ended before it was seen mid-run: {run.proc.stderr.read()!r}"
            )
            assert time.monotonic() < deadline, f"{command} was never seen mid-run"
            time.sleep(0.05)
        run.proc.send_signal(signum)
        _, err = run.proc.communicate(timeout=60)
    finally:
        if run.proc is not None and run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
        if run.holder is not None:
            run.holder.close()
    stderr = err.decode("utf-8", "replace")
    assert run.proc.returncode == code, stderr
    assert "Traceback" not in stderr and f"stopped by {sig}" in stderr, stderr
    case.after(run)
    if case.job is not None:
        last = conn.execute(
            "SELECT outcome, error FROM jobs WHERE job = %s ORDER BY id DESC LIMIT 1", (case.job,)
        ).fetchone()
        assert last is not None and last["outcome"] == "interrupted" and sig in last["error"], last
