"""What a model's vectors cost on disk and in memory, estimated before any data (`memctl size --estimate`).

Estimates (`estimate`) model how PostgreSQL and pgvector lay the rows out; the
constants were measured on PostgreSQL 18.6 + pgvector 0.8.6 (8 kB pages, HNSW
m = 16, ef_construction = 64, agent 'default'):

    bytes per vector   vector 4*d + 8, halfvec 2*d + 8 (pgvector's datum size)
    heap + TOAST       row = 24-byte tuple header + agent + chunk_id + content_hash +
                       vector; the vector moves to TOAST when the row exceeds 2,032
                       bytes, in chunks of 1,996 bytes; pages filled in insertion order
    other indexes      primary key 36 bytes a row, content_hash btree 76 (measured)
    HNSW index         one element tuple MAXALIGN(72 + bytes_per_vector) and one
                       neighbour tuple MAXALIGN(4 + 2*m*6) per row, packed together
                       into 8,160-byte pages: floor(8160 / (element + neighbours + 8))
                       rows a page, or two pages a row when they do not fit one.
                       Measured 2,049.6 bytes a row at 384 dims (5,000 rows),
                       estimated 2,048.
    build memory       rows * (bytes_per_vector + 704): pgvector's in-memory graph,
                       measured from where the "hnsw graph no longer fits into
                       maintenance_work_mem" notice appears (1 MB: 466 rows at 384
                       dims, 278 at 768, 153 at 1,536; halfvec 708 at 384).
"""

from __future__ import annotations

import math

from memctl import model_catalogue
from memctl.embedding import models
from memctl.errors import UsageError

MIB = 1024 * 1024
PAGE = 8192
HEAP_USABLE = PAGE - 24  # page header
HNSW_USABLE = PAGE - 24 - 8  # page header and pgvector's special space
LINE_POINTER = 4
TOAST_THRESHOLD = 2032
TOAST_CHUNK = 1996
TOAST_POINTER = 18
TOAST_INDEX_BYTES = 28  # per TOAST tuple, btree on (chunk_id, chunk_seq) (measured)
PKEY_BYTES_PER_ROW = 36  # (agent, chunk_id) (measured)
HASH_INDEX_BYTES_PER_ROW = 76  # content_hash, random order (measured)
ROW_BEFORE_VECTOR = (
    24 + 8 + 8 + 33
)  # tuple header, agent 'default', chunk_id, content_hash (sha256)
HNSW_M = 16
HNSW_ELEMENT_HEADER = 72
GRAPH_BYTES_PER_ROW = 704  # beyond the vector itself, m = 16


def _maxalign(n: int) -> int:
    return (n + 7) // 8 * 8


def _mib(n: int | None) -> float | None:
    return None if n is None else round(n / MIB, 2)


def bytes_per_vector(dims: int, storage: str = "vector") -> int:
    """pgvector's datum size: vector 4*d + 8, halfvec 2*d + 8."""
    return (2 if storage == "halfvec" else 4) * dims + 8


def indexable(dims: int, storage: str) -> bool:
    limit = models.MAX_HALFVEC_INDEX_DIMS if storage == "halfvec" else models.MAX_VECTOR_INDEX_DIMS
    return dims <= limit


def _pages(tuple_sizes: list[int], rows: int, usable: int) -> int:
    """Pages used by `rows` rows each inserting `tuple_sizes`, filling pages in order."""
    if rows <= 0:
        return 0
    simulated = min(rows, 2000)
    pages, free = 0, 0
    for _ in range(simulated):
        for size in tuple_sizes:
            need = _maxalign(size) + LINE_POINTER
            if need > free:
                pages, free = pages + 1, usable
            free -= need
    return math.ceil(pages * rows / simulated)


def table_bytes(rows: int, dims: int, storage: str = "vector") -> int:
    """Heap, TOAST and the btree indexes of a model's vector table (sql/templates/vectors.sql)."""
    vector = bytes_per_vector(dims, storage)
    indexes = rows * (PKEY_BYTES_PER_ROW + HASH_INDEX_BYTES_PER_ROW)
    row = (ROW_BEFORE_VECTOR + 3) // 4 * 4 + vector  # a vector is 4-byte aligned
    if row <= TOAST_THRESHOLD:
        return _pages([row], rows, HEAP_USABLE) * PAGE + indexes
    heap = _pages([ROW_BEFORE_VECTOR + TOAST_POINTER], rows, HEAP_USABLE) * PAGE
    chunks = [TOAST_CHUNK] * (vector // TOAST_CHUNK) + (
        [vector % TOAST_CHUNK] if vector % TOAST_CHUNK else []
    )
    toast = _pages([36 + c for c in chunks], rows, HEAP_USABLE) * PAGE
    return heap + toast + rows * len(chunks) * TOAST_INDEX_BYTES + indexes


def index_bytes(rows: int, dims: int, storage: str = "vector", m: int = HNSW_M) -> int | None:
    """HNSW index size (see the module docstring); None when HNSW cannot index these dimensions."""
    if not indexable(dims, storage):
        return None
    element = _maxalign(HNSW_ELEMENT_HEADER + bytes_per_vector(dims, storage))
    neighbours = _maxalign(4 + 2 * m * 6)
    combined = element + neighbours + 2 * LINE_POINTER
    pages = math.ceil(rows / (HNSW_USABLE // combined)) if combined <= HNSW_USABLE else 2 * rows
    return (pages + 1) * PAGE  # + the meta page


def build_memory(rows: int, dims: int, storage: str = "vector") -> int:
    """Memory an HNSW build wants to keep its whole graph in maintenance_work_mem."""
    return rows * (bytes_per_vector(dims, storage) + GRAPH_BYTES_PER_ROW)


def _note(dims: int, storage: str) -> str | None:
    if storage == "vector" and dims > models.MAX_VECTOR_INDEX_DIMS:
        if dims <= models.MAX_HALFVEC_INDEX_DIMS:
            return f"cannot be indexed as vector (over {models.MAX_VECTOR_INDEX_DIMS:,} dims): fits as halfvec"
        return (
            f"cannot be indexed (over {models.MAX_VECTOR_INDEX_DIMS:,} dims as vector, "
            f"{models.MAX_HALFVEC_INDEX_DIMS:,} as halfvec): ask the model for fewer dimensions"
        )
    if storage == "halfvec" and dims > models.MAX_HALFVEC_INDEX_DIMS:
        return (
            f"cannot be indexed (over {models.MAX_HALFVEC_INDEX_DIMS:,} dims as halfvec): "
            "ask the model for fewer dimensions"
        )
    return None


def estimate_one(
    rows: int, dims: int, storage: str = "vector", model: str | None = None, note: str | None = None
) -> dict:
    if dims <= 0:
        raise UsageError(f"dimensions must be positive, got {dims}")
    table = table_bytes(rows, dims, storage)
    index = index_bytes(rows, dims, storage)
    notes = [n for n in (_note(dims, storage), note) if n]
    return {
        "model": model,
        "dims": dims,
        "storage": storage,
        "rows": rows,
        "bytes_per_vector": bytes_per_vector(dims, storage),
        "vectors_mib": _mib(rows * bytes_per_vector(dims, storage)),
        "table_mib": _mib(table),
        "index_mib": _mib(index),
        "total_mib": _mib(table + (index or 0)),
        "build_mem_mib": _mib(build_memory(rows, dims, storage)) if index is not None else None,
        "indexable": index is not None,
        "note": "; ".join(notes) or None,
    }


def model_dims(model: str, settings=None) -> int:
    """A model's native size: memctl's table of common models, else Ollama's /api/show when settings are given."""
    dims = model_catalogue.known_dims(model)
    if dims is not None:
        return dims
    if settings is not None:
        from memctl.embedding.embedders import make_embedder
        from memctl.errors import MemctlError

        try:
            return make_embedder(
                settings, embedder="ollama", model=model, timeout=settings.embedding.search_timeout
            ).dims()
        except MemctlError:
            pass
    raise UsageError(
        f"unknown model {model!r} (not in memctl's list, not on the Ollama server): give --dims"
    )


def estimate(
    rows: int,
    *,
    dims: int | None = None,
    model: str | None = None,
    halfvec: bool = False,
    settings=None,
) -> list[dict]:
    """Sizes for `rows` vectors of one model (--dims, or a model name), or of common models when neither is given."""
    if rows < 0:
        raise UsageError(f"--rows must be >= 0, got {rows}")
    storage = "halfvec" if halfvec else "vector"
    if dims is None and model is not None:
        dims = model_dims(model, settings)
    if dims is not None:
        return [estimate_one(rows, dims, storage, model)]
    return [
        estimate_one(rows, d, storage, name, note)
        for name, d, note in model_catalogue.COMMON_MODELS
    ]


def build_warning(model: models.Model, rows: int, limit: int) -> str | None:
    """A warning when an HNSW build over `rows` rows would outgrow maintenance_work_mem."""
    need = build_memory(rows, model.dims, model.storage)
    if need <= limit:
        return None
    return (
        f"an HNSW index build for {model.label} over {rows:,} rows needs about {need / MIB:,.0f} MiB, more than "
        f"maintenance_work_mem ({limit / MIB:,.0f} MiB): the build would slow sharply once the graph no longer "
        f"fits; raise it for memctl's role (ALTER ROLE CURRENT_USER SET maintenance_work_mem = "
        f"'{_suggest(need)}', which needs no superuser and applies from the next connection)"
    )


def _suggest(need: int) -> str:
    mib = 2 ** math.ceil(math.log2(max(need * 1.25, MIB) / MIB))
    return f"{mib // 1024}GB" if mib >= 1024 else f"{mib}MB"
