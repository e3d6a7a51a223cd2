"""How long embedding takes: one chunk at a time and batched, projected onto the corpus.

`measure` embeds a sample of real chunks (or lines of a file) with the given
embedder: first one warm-up call (model load, not counted), then each chunk
alone (latency: p50_ms, p95_ms), then the sample in batches of `batch_size`
(throughput: per_s; a sample smaller than one batch is repeated to fill it).
The projections divide the corpus by that throughput:

    projected_s          chunks in the corpus / per_s
    backlog_projected_s  chunks waiting for this model / per_s (every chunk when the
                         model is not registered: a new model embeds them all)
    tokens               prompt_eval_count per sampled chunk * chunks in the corpus
    second_model_bytes   memctl.embedding.footprint's estimate of a vector table and HNSW index
                         holding every chunk at this model's dimensions
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memctl.files import jsonl
from memctl.embedding import footprint, models
from memctl.embedding.protocol import as_documents
from memctl.errors import BadValue, InvalidInput, UsageError

if TYPE_CHECKING:
    from memctl.db.memory import Memory

SAMPLE = "SELECT content FROM chunks ORDER BY random() LIMIT %s"
CHUNKS = "SELECT count(*) AS n FROM chunks"
QUEUED = "SELECT count(*) AS n FROM embed_queue WHERE model_id = %s"


def percentile(values: list[float], pct: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    position = (len(ordered) - 1) * pct / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


TEXT_FIELDS = ("content", "text", "query")


def _record_text(record: Any, number: int) -> str:
    """The text of one JSONL record: its first text field, which must be a non-empty string."""
    if not isinstance(record, dict):
        raise BadValue(f'line {number}: expected a JSON object with "content"', "content")
    name = next((k for k in TEXT_FIELDS if k in record), None)
    if name is None:
        raise BadValue(
            f'line {number}: field content: missing (give "content", "text" or "query")', "content"
        )
    value = record[name]
    if not isinstance(value, str) or not value.strip():
        shown = json.dumps(value)[:60]
        raise BadValue(
            f"line {number}: field {name}: must be a non-empty string, got {shown}", name
        )
    return value


def read_texts(path: str | Path) -> list[str]:
    """Texts from a file: JSONL lines with "content" (or "text"/"query"), else one text per line.

    A line that starts with "{" is JSON, read by memctl.files.jsonl (a malformed one fails, naming the
    line); its text field must be a non-empty string (BadValue naming the line and the field).
    """
    try:
        lines = Path(path).read_bytes().splitlines()
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}") from None
    texts = []
    for number, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            raise jsonl.LineError(number, f"not valid UTF-8 (byte {exc.start})") from None
        if not line:
            continue
        if not line.startswith("{"):
            texts.append(line)
            continue
        try:
            record = jsonl.parse(line, required=())
        except InvalidInput as exc:
            raise jsonl.at(number, exc) from None
        texts.append(_record_text(record, number))
    if not texts:
        raise InvalidInput(f"{path} holds no texts")
    return texts


def sample_chunks(conn: Memory, n: int) -> list[str]:
    return [row["content"] for row in conn.execute(SAMPLE, (n,)).fetchall()]


def _backlog(conn: Memory, embedder, chunks: int) -> tuple[int, str]:
    """Chunks this model still has to embed, and whose backlog it is."""
    for model in models.all_models(conn):
        if model.state in ("active", "backfill") and models.matches(model, embedder):
            return conn.one(QUEUED, (model.id,))["n"], model.state
    return chunks, "new model"


def measure(
    conn: Memory,
    embedder,
    *,
    sample: int = 20,
    batch_size: int = 32,
    texts: list[str] | None = None,
) -> dict:
    if sample < 1 or batch_size < 1:
        raise UsageError("--sample and --batch-size must be at least 1")
    chunks = conn.one(CHUNKS)["n"]
    texts = list(texts[:sample]) if texts is not None else sample_chunks(conn, sample)
    if not texts:
        raise UsageError("no chunks to time yet: store some episodes or give --file")
    texts = as_documents(
        embedder, texts
    )  # as the worker sends them: the model's document instruction first
    embedder.embed(texts[:1])  # warm-up: model load and connection, not counted
    latencies: list[float] = []
    tokens: int | None = 0
    for text in texts:
        started = time.perf_counter()
        result = embedder.embed([text])
        latencies.append(time.perf_counter() - started)
        tokens = (
            None
            if tokens is None or result.prompt_eval_count is None
            else tokens + result.prompt_eval_count
        )
    batched = [texts[i % len(texts)] for i in range(max(len(texts), batch_size))]
    started = time.perf_counter()
    for i in range(0, len(batched), batch_size):
        embedder.embed(batched[i : i + batch_size])
    per_s = len(batched) / max(time.perf_counter() - started, 1e-9)
    backlog, backlog_of = _backlog(conn, embedder, chunks)
    dims = embedder.dims()
    kind = "vector" if dims <= models.MAX_VECTOR_INDEX_DIMS else "halfvec"
    return {
        "embedder": embedder.name,
        "model": embedder.model,
        "dims": dims,
        "sample": len(texts),
        "batch_size": batch_size,
        "p50_ms": round(percentile(latencies, 50) * 1000, 2),
        "p95_ms": round(percentile(latencies, 95) * 1000, 2),
        "per_s": round(per_s, 1),
        "chunks": chunks,
        "projected_s": round(chunks / per_s, 1),
        "backlog": backlog,
        "backlog_of": backlog_of,
        "backlog_projected_s": round(backlog / per_s, 1),
        "sample_tokens": tokens,
        "tokens": round(tokens / len(texts) * chunks) if tokens is not None else None,
        "second_model_bytes": footprint.table_bytes(chunks, dims, kind)
        + (footprint.index_bytes(chunks, dims, kind) or 0),
    }
