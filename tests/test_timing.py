"""memctl embed timing: one chunk at a time, batched, and projected onto the corpus."""

from __future__ import annotations

import json

import pytest

from memctl.embedding import footprint, timing
from tests.ollama_server import OllamaTestServer

FIELDS = {
    "p50_ms",
    "p95_ms",
    "per_s",
    "projected_s",
    "backlog",
    "backlog_projected_s",
    "tokens",
    "sample_tokens",
    "second_model_bytes",
    "chunks",
    "sample",
    "batch_size",
    "dims",
    "model",
    "embedder",
}


def load(cli, n: int = 30) -> None:
    lines = "\n".join(
        json.dumps(
            {"content": f"chunk {i}: the nightly backup of db{i % 4} finished in {i} minutes"}
        )
        for i in range(n)
    )
    assert cli("episode", "import", "-", input=lines + "\n").exit_code == 0


def test_timing_fields_and_projections(cli):
    load(cli)
    outcome = cli("embed", "timing", "--sample", "10", "--batch-size", "4", "-f", "json")
    assert outcome.exit_code == 0, outcome.stderr
    report = outcome.json()
    assert FIELDS <= set(report)
    assert report["sample"] == 10 and report["chunks"] == 30 and report["batch_size"] == 4
    assert 0 < report["p50_ms"] <= report["p95_ms"]
    assert report["per_s"] > 0
    assert report["projected_s"] == pytest.approx(30 / report["per_s"], rel=0.01, abs=0.1)
    # No model registered yet: a new model has every chunk to embed.
    assert (report["backlog"], report["backlog_of"]) == (30, "new model")
    assert report["sample_tokens"] > 0
    assert report["tokens"] == round(report["sample_tokens"] / 10 * 30)
    assert report["second_model_bytes"] == footprint.table_bytes(30, 384) + footprint.index_bytes(
        30, 384
    )

    assert cli("embed").exit_code == 0
    after = cli("embed", "timing", "--sample", "5", "-f", "json").json()
    assert (after["backlog"], after["backlog_of"], after["backlog_projected_s"]) == (
        0,
        "active",
        0.0,
    )


def test_one_chunk_at_a_time_then_batched_against_ollama(cli):
    """The embedder really sees single-text requests for latency and full batches for throughput."""
    load(cli, 12)
    with OllamaTestServer() as server:
        env = {
            "MEMCTL_EMBEDDER": "ollama",
            "MEMCTL_EMBED_MODEL": "nomic-embed-text",
            "OLLAMA_HOST": server.url,
        }
        outcome = cli(
            "embed", "timing", "--sample", "10", "--batch-size", "4", "-f", "json", env=env
        )
        assert outcome.exit_code == 0, outcome.stderr
        sizes = [n for _, model, n in server.embed_requests()]
    report = outcome.json()
    assert sizes == [1] * 11 + [4, 4, 2]  # warm-up, 10 singles, then the sample in batches of 4
    assert report["dims"] == 768 and report["model"] == "nomic-embed-text"
    assert report["sample_tokens"] > 0  # prompt_eval_count from the server


def test_timing_a_file_and_small_samples(cli, tmp_path):
    load(cli, 3)
    texts = tmp_path / "texts.jsonl"
    texts.write_text(
        "\n".join(json.dumps({"content": f"text number {i}"}) for i in range(5)) + "\n"
    )
    report = cli(
        "embed", "timing", "--file", str(texts), "--sample", "50", "--batch-size", "8", "-f", "json"
    ).json()
    assert report["sample"] == 5 and report["chunks"] == 3
    plain = tmp_path / "texts.txt"
    plain.write_text("first line\n\nsecond line\n")
    assert timing.read_texts(plain) == ["first line", "second line"]


def test_timing_with_no_chunks_and_no_file_is_refused(cli):
    outcome = cli("embed", "timing")
    assert outcome.exit_code == 2 and "--file" in outcome.stderr


def test_percentile_interpolates():
    assert timing.percentile([1, 2, 3, 4], 50) == 2.5
    assert timing.percentile([10.0], 95) == 10.0
    assert timing.percentile(list(range(101)), 95) == 95
