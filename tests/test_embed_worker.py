"""The embed worker against an Ollama-protocol server, through the real ollama client."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from memctl import db


def add_many(cli, n: int, prefix: str = "episode") -> None:
    data = "".join(
        json.dumps({"content": f"{prefix} {i}: the service restarted after memory pressure {i}"})
        + "\n"
        for i in range(n)
    )
    assert cli("episode", "import", "-", input=data).exit_code == 0


def vector_count(conn) -> int:
    table = conn.execute(
        "SELECT table_name FROM embedding_models WHERE state = 'active'"
    ).fetchone()["table_name"]
    return conn.execute(f'SELECT count(*) AS n FROM "{table}"').fetchone()[
        "n"
    ]  # name from our registry


def test_embed_in_batches_registers_the_model_and_empties_the_backlog(
    cli, conn, ollama, ollama_env
):
    add_many(cli, 10)
    result = cli("embed", "--batch-size", "4", "-f", "json")
    assert result.exit_code == 0, result.stderr
    run = result.json()[0]
    assert run["chunks"] == 10 and run["model"].startswith("ollama:all-minilm (384 dims")
    sizes = [n for path, model, n in ollama.embed_requests()]
    assert sizes == [4, 4, 2]  # one HTTP request per batch
    status = cli("status", "-f", "json").json()
    assert status["pending"] == 0 and status["failed"] == 0 and status["episodes"] == 10
    assert status["active_model"].startswith("ollama:all-minilm")
    assert status["last_embed"]["outcome"] == "ok" and status["last_embed"]["rows"] == 10
    assert vector_count(conn) == 10


def test_ollama_down_exit_3_rows_stay_pending_then_recovery(cli, conn, ollama, ollama_env):
    add_many(cli, 3)
    cli("embed")  # registers the model
    add_many(cli, 5, prefix="later")
    ollama.down()
    result = cli("embed")
    assert result.exit_code == 3
    assert "unreachable" in result.stderr
    assert cli("status", "-f", "json").json()["pending"] == 5
    assert cli("status", "-f", "json").json()["last_embed"]["outcome"] == "unavailable"
    # writes still succeed while the embedder is down
    assert cli("episode", "add", "written while ollama is down").exit_code == 0
    ollama.up()
    assert cli("embed").exit_code == 0
    assert cli("status", "-f", "json").json()["pending"] == 0
    assert vector_count(conn) == 9


def test_first_run_with_ollama_down_exits_3_and_keeps_rows(cli, ollama, ollama_env):
    add_many(cli, 2)
    ollama.down()
    result = cli("embed")
    assert result.exit_code == 3
    assert cli("status", "-f", "json").json()["pending"] == 2


@pytest.mark.parametrize("fault,code", [("500", 3), ("slow", 3)])
def test_server_errors_and_timeouts_leave_rows_pending(
    cli, ollama, ollama_env, memctl_env, fault, code
):
    add_many(cli, 2)
    cli("embed")
    add_many(cli, 2, prefix="more")
    ollama.inject(fault, delay_s=3 if fault == "slow" else None)
    (__import__("pathlib").Path(memctl_env["MEMCTL_CONFIG"])).write_text(
        "[embedding]\ntimeout = 0.5\n"
    )
    result = cli("embed")
    assert result.exit_code == code, result.stderr
    ollama.clear()
    assert cli("status", "-f", "json").json()["pending"] == 2


def test_unknown_model_is_a_clear_error(cli, ollama, ollama_env):
    add_many(cli, 1)
    result = cli("embed", env={"MEMCTL_EMBED_MODEL": "no-such-model"})
    assert result.exit_code == 1
    assert "ollama pull no-such-model" in result.stderr


def test_a_chunk_the_model_rejects_is_split_or_marked_failed(cli, conn, ollama, ollama_env):
    # a 40-token context: ordinary chunks are split and averaged; a chunk whose every half is too long
    # (a single huge "word") is marked failed with its error, not retried forever
    from memctl.embedding.embedders import HashEmbedder

    tiny = HashEmbedder("tiny", 384)
    ollama.add_model("tiny-context", 384, 40, lambda texts: tiny.embed(texts).vectors)
    env = {"MEMCTL_EMBED_MODEL": "tiny-context"}
    cli("episode", "add", " ".join(f"word{i}" for i in range(120)), env=env)
    cli("episode", "add", "short one", env=env)
    first = cli("embed", "-f", "json", env=env)
    assert first.exit_code == 0, first.stderr
    assert first.json()[0]["chunks"] == 2 and first.json()[0]["failed"] == 0
    assert vector_count(conn) == 2


def test_a_configured_model_other_than_the_database_s_warns_and_follows_the_database(
    cli, conn, ollama, ollama_env
):
    add_many(cli, 1)
    cli("embed")
    add_many(cli, 2, prefix="later")
    other = cli("embed", "-f", "json", env={"MEMCTL_EMBED_MODEL": "nomic-embed-text"})
    assert other.exit_code == 0, other.stderr
    assert other.json()[0]["chunks"] == 2 and other.json()[0]["model"].startswith(
        "ollama:all-minilm"
    )
    assert (
        other.stderr.count("memctl:") == 1
        and "reembed start --model nomic-embed-text" in other.stderr
    )
    assert {m for _, m, _ in ollama.embed_requests()} == {
        "all-minilm"
    }  # never the configured model
    assert vector_count(conn) == 3
    search = cli(
        "episode", "search", "memory", "-f", "json", env={"MEMCTL_EMBED_MODEL": "nomic-embed-text"}
    )
    assert search.exit_code == 0 and "reembed start" in search.stderr
    assert search.json()[0]["vector_rank"] is not None


def test_two_workers_never_embed_a_chunk_twice(cli, db_url, ollama, ollama_env):
    add_many(cli, 1)
    cli("embed")
    add_many(cli, 60, prefix="parallel")
    ollama.inject("slow", delay_s=0.05)  # keep both workers busy at once
    from memctl import config
    from memctl.embedding import worker as embed_worker
    from memctl.embedding.embedders import make_embedder

    settings = config.load()
    results, errors = [], []

    def worker():
        try:
            with db.connect(db_url, vector=True) as c:
                results.extend(
                    embed_worker.work(
                        c.use_settings(settings), make_embedder(settings), batch_size=5
                    )[0]
                )
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(r.chunks for r in results) == 60
    assert all(r.chunks > 0 for r in results), "both workers should have taken part"
    embedded_texts = [n for path, model, n in ollama.embed_requests()]
    assert sum(embedded_texts) == 61  # 1 earlier + 60, none twice


def test_kill_9_mid_batch_loses_nothing(memctl_bin, memctl_env, cli, conn, ollama, ollama_env):
    add_many(cli, 1)
    cli("embed")
    add_many(cli, 30, prefix="killed")
    ollama.inject("slow", delay_s=30)  # the worker will hang inside its first batch
    env = {**os.environ, **ollama_env}
    proc = subprocess.Popen(
        [sys.executable, "-m", "memctl", "embed", "--batch-size", "10"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 30
    while time.time() < deadline and not ollama.embed_requests():
        time.sleep(0.1)
    assert ollama.embed_requests(), "the worker never reached the embedder"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    ollama.clear()
    assert cli("status", "-f", "json").json()["pending"] == 30
    after = cli("embed", "-f", "json")
    assert after.exit_code == 0 and after.json()[0]["chunks"] == 30
    assert vector_count(conn) == 31


def _wait_for(condition, seconds: float = 60) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline and not condition():
        time.sleep(0.1)
    assert condition(), "the loop never got there"


def test_embed_loop_idle_passes_print_nothing_and_share_one_job_row(cli, conn, ollama, ollama_env):
    add_many(cli, 1)
    assert cli("embed").exit_code == 0

    def embed_jobs() -> list[tuple[int, int | None]]:
        return [
            (r["rows"], r["detail"].get("idle_passes"))
            for r in conn.execute(
                "SELECT rows, detail FROM jobs WHERE job = 'embed' ORDER BY id"
            ).fetchall()
        ]

    env = {**os.environ, **ollama_env}
    proc = subprocess.Popen(
        [sys.executable, "-m", "memctl", "embed", "--loop", "--interval", "1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(lambda: (embed_jobs()[-1][1] or 0) >= 3)
        add_many(cli, 2, prefix="while looping")
        _wait_for(lambda: len(embed_jobs()) == 4 and embed_jobs()[-1][1] is not None)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err  # stopped by SIGTERM (memctl.interrupts)
    jobs = embed_jobs()
    assert [rows for rows, _ in jobs] == [1, 0, 2, 0] and jobs[1][1] >= 3  # one row per idle streak
    assert out.count("chunks_per_s") == 1  # one table: the pass that had work
    assert err.count("nothing to embed") == 1 and "Traceback" not in err
