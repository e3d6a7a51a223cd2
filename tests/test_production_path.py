"""The production path's failure modes: orphaned chunks, refused chunks, SIGTERM, batch degradation, negation.

Each of these was a defect found by running memctl as an operator would (issue 10);
each test drives the real worker or the CLI against the real database and the
Ollama-protocol test server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from memctl import config, db
from memctl.embedding import models
from memctl.embedding import worker as embed_worker
from memctl.embedding.embedders import make_embedder
from memctl.records import episodes
from memctl.write import gate


def vectors(conn) -> int:
    model = models.active(conn)
    return conn.execute(f'SELECT count(*) AS n FROM "{model.table_name}"').fetchone()[
        "n"
    ]  # name from our registry


def chunks(conn) -> int:
    return conn.execute("SELECT count(*) AS n FROM chunks").fetchone()["n"]


def import_jsonl(cli, texts, **fields) -> None:
    data = "".join(json.dumps({"content": t, **fields}) + "\n" for t in texts)
    assert cli("episode", "import", "-", input=data).exit_code == 0


# --------------------------------------------------------------- orphaned chunks


def test_the_first_embed_waits_for_an_import_in_flight_and_queues_its_chunks(
    cli, conn, db_url, memctl_env, monkeypatch
):
    """An import whose transaction is open while the first `memctl embed` registers the model.

    Its first batch is copied before the registration, its last after. The
    registration waits for the import (locks.WRITE_LOCK), so every chunk is queued.
    """
    monkeypatch.setattr(episodes, "BATCH", 2)
    settings = config.load()
    first_batch_copied, release = threading.Event(), threading.Event()
    errors = []

    def slow_source():
        for i in range(2):
            yield gate.validate(settings, f"early episode {i} about the payment queue")
        yield gate.validate(settings, "the third episode, after the model exists")
        first_batch_copied.set()  # asked for item 4: batch 1 went to the copying thread, item 3 waits
        release.wait(60)

    def importer():
        try:
            with db.connect(db_url) as c:
                episodes.import_episodes(
                    c.use_settings(settings), slow_source(), result=episodes.ImportResult()
                )
        except Exception as exc:  # reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=importer)
    thread.start()
    assert first_batch_copied.wait(60)
    worker = subprocess.Popen(
        [_memctl(), "embed", "-f", "json"],
        env={**os.environ, **memctl_env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert _waits_for_a_lock(conn), "the first embed did not wait for the import in flight"
        release.set()
        thread.join(60)
        out, err = worker.communicate(timeout=60)
    finally:
        release.set()
        worker.kill()
    assert errors == [] and worker.returncode == 0, err.decode()
    assert json.loads(out)[0]["chunks"] == 3
    assert vectors(conn) == chunks(conn) == 3
    assert cli("status", "-f", "json").json()["orphaned"] == 0


def _waits_for_a_lock(conn, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = 'memctl' "
            "AND wait_event_type = 'Lock' AND datname = current_database()"
        ).fetchone()
        if row["n"]:
            return True
        time.sleep(0.05)
    return False


def test_orphaned_chunks_from_an_earlier_memctl_are_reported_and_queued_by_embed(
    cli, conn, memctl_env
):
    import_jsonl(cli, [f"episode {i} about the payment queue" for i in range(5)])
    assert cli("embed").exit_code == 0
    import_jsonl(cli, ["written by a memctl that lost its queue rows", "and this one"])
    conn.execute("DELETE FROM embed_queue")  # what the race left behind before locks.WRITE_LOCK
    status = cli("status", "-f", "json")
    assert status.json()["orphaned"] == 2 and status.json()["pending"] == 0
    assert any("no queue row" in w for w in status.json()["warnings"])

    second = cli("embed", "-f", "json")
    assert second.exit_code == 0, second.stderr
    assert "queued 2 chunk(s)" in second.stderr and second.json()[0]["chunks"] == 2
    assert vectors(conn) == chunks(conn) == 7
    assert cli("status", "-f", "json").json()["orphaned"] == 0


def test_two_workers_configured_differently_on_an_empty_database_register_one_model(
    cli, conn, db_url
):
    import_jsonl(cli, [f"episode {i}" for i in range(6)])
    settings = config.load()
    start = threading.Barrier(2)
    results, errors = {}, []

    def worker(name):
        try:
            with db.connect(db_url, vector=True) as c:
                start.wait(10)
                results[name] = embed_worker.work(
                    c.use_settings(settings),
                    make_embedder(settings, embedder="hash", model=name),
                    batch_size=5,
                )
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("hash-a", "hash-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    registered = models.all_models(conn)
    assert len(registered) == 1
    loser = "hash-b" if registered[0].model == "hash-a" else "hash-a"
    assert any("database's active model" in w for w in results[loser][1])
    assert all(r.model == registered[0].label for runs, _ in results.values() for r in runs)


# ------------------------------------------------------- refused chunks, end to end


def test_a_chunk_the_model_refuses_is_failed_counted_and_retried(cli, conn, ollama, ollama_env):
    import_jsonl(cli, ["an episode embedded while the model was healthy"])
    assert cli("embed").exit_code == 0
    import_jsonl(cli, ["the model will refuse this text", "and this one too"])
    ollama.inject(
        "400"
    )  # every request: the input exceeds the context length, even split in halves
    refused = cli("embed", "-f", "json")
    assert refused.exit_code == 0, refused.stderr
    assert refused.json()[0]["failed"] == 2 and vectors(conn) == 1
    status = cli("status", "-f", "json")
    assert status.json()["failed"] == 2 and any(
        "retry-failed" in w for w in status.json()["warnings"]
    )
    assert cli("jobs", "--job", "embed", "-f", "json").json()[0]["outcome"] == "partial"

    ollama.clear()
    assert (
        cli("embed", "-f", "json").json() == []
    )  # an idle pass: failed chunks are not retried on their own
    retried = cli("embed", "--retry-failed", "-f", "json")
    assert retried.exit_code == 0 and retried.json()[0]["chunks"] == 2
    assert vectors(conn) == 3 and cli("status", "-f", "json").json()["failed"] == 0


def test_embed_loop_stops_on_sigterm_after_the_batch_in_flight(
    conn, memctl_bin, ollama, ollama_env, cli
):
    import_jsonl(cli, [f"episode {i} of a long backlog about disk pressure" for i in range(40)])
    ollama.inject("slow", delay_s=0.4)  # every request takes a while: SIGTERM lands mid-batch
    proc = subprocess.Popen(
        [_memctl(), "embed", "--loop", "--interval", "30", "--batch-size", "4"],
        env={**os.environ, **ollama_env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _has_vectors(conn):
            time.sleep(0.1)
        assert _has_vectors(conn), "the worker never committed a batch"
        time.sleep(0.2)  # inside the next batch's request
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    stderr = err.decode()
    assert proc.returncode == 143, stderr  # 128 + SIGTERM: stopped when told (memctl.interrupts)
    assert "stopped by SIGTERM" in stderr and "Traceback" not in stderr
    done = vectors(conn)
    queued = conn.execute("SELECT count(*) AS n FROM embed_queue").fetchone()["n"]
    assert 0 < done < 40 and done % 4 == 0  # whole batches only: the one in flight committed
    assert done + queued == 40  # nothing lost
    last = cli("jobs", "--job", "embed", "-f", "json").json()[0]
    assert last["outcome"] == "interrupted" and last["rows"] == done


def _memctl() -> str:
    import shutil
    import sys

    return shutil.which("memctl") or str(Path(sys.executable).parent / "memctl")


def _has_vectors(conn) -> bool:
    model = models.active(conn)
    return model is not None and vectors(conn) > 0


# ------------------------------------------------------------------ batch search


def _batch(queries) -> str:
    return "".join(json.dumps(q) + "\n" for q in queries)


def test_batch_search_embeds_in_sub_batches_and_only_a_failed_one_degrades(
    cli, conn, ollama, ollama_env
):
    import_jsonl(cli, [f"host{i} ran out of inodes on /var/log{i}" for i in range(20)])
    assert cli("embed").exit_code == 0
    queries = [{"query": f"inode exhaustion on host{i % 20}", "k": 3} for i in range(100)]
    ollama.requests.clear()
    healthy = cli("episode", "search", "--batch", "-", "--no-track", input=_batch(queries))
    assert healthy.exit_code == 0 and healthy.stderr == ""
    sizes = [n for path, _, n in ollama.embed_requests()]
    assert sizes == [32, 32, 32, 4]  # [embedding] batch_size, each its own request and timeout
    assert all(
        line["results"][0]["vector_rank"] is not None
        for line in map(json.loads, healthy.stdout.splitlines())
    )

    ollama.inject("500", times=1)  # the first sub-batch fails, the rest answer
    partial = cli("episode", "search", "--batch", "-", "--no-track", input=_batch(queries))
    assert partial.exit_code == 0
    assert (
        partial.stderr.count("memctl:") == 1
        and "32 of 100 queries fell back to text search" in partial.stderr
    )
    answers = [json.loads(line) for line in partial.stdout.splitlines()]
    with_vectors = [a for a in answers if any(h["vector_rank"] is not None for h in a["results"])]
    assert len(answers) == 100 and len(with_vectors) == 68

    ollama.down()
    down = cli("episode", "search", "--batch", "-", "--no-track", input=_batch(queries))
    assert down.exit_code == 0 and "text search only" in down.stderr
    assert len(ollama.embed_requests()) == 4 + 4 + 0  # down: no request reaches the server


def test_batch_query_with_mode_vector_is_never_answered_by_words(cli, ollama, ollama_env):
    import_jsonl(cli, ["the cron job rotated the nginx logs"])
    assert cli("embed").exit_code == 0
    ollama.inject("500")
    queries = [{"query": "log rotation"}, {"query": "nginx logs", "mode": "vector"}]
    refused = cli("episode", "search", "--batch", "-", input=_batch(queries))
    assert refused.exit_code == 3 and refused.stdout == ""
    assert "--mode vector" in refused.stderr
    single = cli("episode", "search", "nginx", "--mode", "vector")
    assert single.exit_code == 3 and single.stdout == ""


# -------------------------------------------------------------------- negation


@pytest.mark.parametrize("mode", ["text", "hybrid"])
def test_negation_excludes_words_and_phrases(cli, mode):
    import_jsonl(
        cli,
        [
            "deploy of the api behind nginx failed",
            "deploy of the worker finished",
            "deploy paused: the disk was full",
            "nginx config reload",
        ],
    )
    cli("embed")

    def found(query):
        result = cli("episode", "search", "--mode", mode, "-k", "10", "-f", "json", "--", query)
        assert result.exit_code == 0, result.stderr
        return [r["content"] for r in result.json()]

    without_nginx = found("deploy -nginx")
    assert without_nginx and not any("nginx" in c for c in without_nginx)
    assert "deploy of the worker finished" in without_nginx
    without_phrase = found('deploy -"disk was full"')
    assert without_phrase and not any("disk was full" in c for c in without_phrase)
    assert "deploy of the api behind nginx failed" in found('"behind nginx"')
    if mode == "text":
        assert found("-deploy") == []  # only an exclusion: nothing, not everything
