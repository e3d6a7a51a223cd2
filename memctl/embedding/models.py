"""The embedding model registry: which model's vectors live in which table.

One model, one vector space: a model's vectors live in a table of their own
(sql/templates/vectors.sql). The database's active model is what search, recall
and the embed worker use; a configured model that differs from it gets a
warning (mismatch_warning), never a mixed index.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memctl.db import locks
from memctl.errors import MemctlError, UsageError

if TYPE_CHECKING:
    from memctl.db.memory import Memory

MAX_VECTOR_INDEX_DIMS = 2000
MAX_HALFVEC_INDEX_DIMS = 4000


@dataclass
class Model:
    id: int
    embedder: str
    model: str
    dims: int
    storage: str
    request_dims: int | None
    table_name: str
    state: str
    query_prefix: str = ""  # the task instructions its vectors were made with (sql/0018)
    document_prefix: str = ""

    @property
    def label(self) -> str:
        instructed = ", with instructions" if self.query_prefix or self.document_prefix else ""
        return f"{self.embedder}:{self.model} ({self.dims} dims, {self.storage}{instructed})"

    @property
    def index_name(self) -> str:
        return f"{self.table_name}_hnsw"

    @property
    def ops(self) -> str:
        return "halfvec_cosine_ops" if self.storage == "halfvec" else "vector_cosine_ops"


COLUMNS = "id, embedder, model, dims, storage, request_dims, table_name, state, query_prefix, document_prefix"
BY_STATE = f"SELECT {COLUMNS} FROM embedding_models WHERE state = %s"  # noqa: S608 - constant columns
ALL = f"SELECT {COLUMNS} FROM embedding_models ORDER BY id"  # noqa: S608
INSERT = """
INSERT INTO embedding_models (embedder, model, dims, storage, request_dims, table_name, state, activated_at,
                              query_prefix, document_prefix)
VALUES (%s, %s, %s, %s, %s, %s, %s, CASE WHEN %s = 'active' THEN now() END, %s, %s)
RETURNING id
"""
SET_TABLE = "UPDATE embedding_models SET table_name = %s WHERE id = %s"
ENQUEUE_ALL = """
INSERT INTO embed_queue (model_id, agent, chunk_id) SELECT %s, agent, id FROM chunks
ON CONFLICT DO NOTHING
"""
# On Citus a transaction that writes embedding_models (a reference table) after reading or writing
# distributed tables must use one connection per node from its start; on one server a placeholder.
SEQUENTIAL = "SET LOCAL citus.multi_shard_modify_mode TO 'sequential'"
# A chunk of this model with no vector, no queue row and no failure row is an orphan:
# written by a transaction that began before the model was registered (its chunks were
# invisible to ENQUEUE_ALL) and so never queued. The embed worker re-queues them.
ORPHANS = """
FROM chunks c
WHERE NOT EXISTS (SELECT 1 FROM {table} v WHERE v.agent = c.agent AND v.chunk_id = c.id)
  AND NOT EXISTS (SELECT 1 FROM embed_queue q WHERE q.model_id = %(id)s AND q.agent = c.agent AND q.chunk_id = c.id)
  AND NOT EXISTS (SELECT 1 FROM embed_failures f
                  WHERE f.model_id = %(id)s AND f.agent = c.agent AND f.chunk_id = c.id)
"""
COUNT_ORPHANS = "SELECT count(*) AS n " + ORPHANS
QUEUE_ORPHANS = (
    "INSERT INTO embed_queue (model_id, agent, chunk_id) SELECT %(id)s, c.agent, c.id "
    + ORPHANS
    + " ON CONFLICT DO NOTHING"
)


def lock_registry(conn: Memory) -> None:
    """The registry lock (exclusive) for the current transaction; call it first in the transaction."""
    conn.execute(SEQUENTIAL)
    conn.execute(locks.LOCK)


def by_state(conn: Memory, state: str) -> Model | None:
    row = conn.execute(BY_STATE, (state,)).fetchone()
    return Model(**row) if row else None


def active(conn: Memory) -> Model | None:
    return by_state(conn, "active")


def all_models(conn: Memory) -> list[Model]:
    return [Model(**row) for row in conn.execute(ALL).fetchall()]


PROTECT = "SELECT memctl_protect(%s::regclass)"
GUARD = "SELECT memctl_guard(%s::regclass)"  # writers older than the schema refused (sql/0025_schema_guard.sql)


def template(name: str) -> str:
    from memctl.db.migrate import sql_dir

    text = (sql_dir() / "templates" / name).read_text(encoding="utf-8")
    return "\n".join(line for line in text.splitlines() if not line.startswith("--")).strip()


def storage_for(dims: int, storage: str = "vector") -> str:
    """Check that HNSW can index `dims` in `storage`; the refusal says what would fit."""
    if storage not in ("vector", "halfvec"):
        raise UsageError(f"unknown storage {storage!r}: choose vector or halfvec")
    if storage == "halfvec":
        if dims > MAX_HALFVEC_INDEX_DIMS:
            raise UsageError(
                f"{dims} dimensions exceed HNSW's limit of {MAX_HALFVEC_INDEX_DIMS} even as halfvec; "
                f"ask the model for fewer with --dims (Ollama's 'dimensions')"
            )
        return storage
    if dims > MAX_VECTOR_INDEX_DIMS:
        hint = (
            "they fit as halfvec: use --halfvec"
            if dims <= MAX_HALFVEC_INDEX_DIMS
            else f"not even as halfvec (limit {MAX_HALFVEC_INDEX_DIMS}): reduce them with --dims"
        )
        raise UsageError(
            f"{dims} dimensions exceed HNSW's limit of {MAX_VECTOR_INDEX_DIMS} for vector; {hint}"
        )
    return storage


def _table_name(model_id: int, model: str, dims: int) -> str:
    slug = re.sub(r"[^a-z0-9]+", "_", model.lower()).strip("_")[:32] or "model"
    return f"vectors_{model_id}_{slug}_{dims}"


def register(
    conn: Memory, embedder, *, state: str, storage: str = "vector", build_index: bool = True
) -> Model:
    """Create a model's row and vector table and queue every existing chunk for it."""
    from psycopg import sql

    from memctl.db import cluster
    from memctl.records import agents

    dims = embedder.dims()
    storage = storage_for(dims, storage)
    with conn.transaction():
        lock_registry(conn)
        existing = by_state(conn, state)
        if existing is not None:
            return existing
        query, document = instructions(embedder)
        model_id = conn.one(
            INSERT,
            (
                embedder.name,
                embedder.model,
                dims,
                storage,
                embedder.request_dims,
                f"pending_{embedder.model}_{state}",
                state,
                state,
                query,
                document,
            ),
        )["id"]
        table = _table_name(model_id, embedder.model, dims)
        conn.execute(SET_TABLE, (table, model_id))
        conn.execute(
            sql.SQL(template("vectors.sql")).format(
                table=sql.Identifier(table),
                fk=sql.Identifier(f"{table}_chunk_fk"),
                hash_index=sql.Identifier(f"{table}_hash"),
                type=sql.SQL(storage),
                dims=sql.Literal(dims),
            )
        )
        cluster.adopt(
            conn, table
        )  # on Citus: distributed by agent beside chunks, before any row or index
        conn.execute(
            PROTECT, (table,)
        )  # row-level security for agents' roles (sql/0019_agents.sql)
        conn.execute(GUARD, (table,))
        agents.grant(conn)
        if build_index:
            model = Model(
                model_id,
                embedder.name,
                embedder.model,
                dims,
                storage,
                embedder.request_dims,
                table,
                state,
                query,
                document,
            )
            conn.execute(index_statement(model, concurrently=False))
        conn.execute(ENQUEUE_ALL, (model_id,))
    made = by_state(conn, state)
    assert made is not None  # registered above
    return made


def _orphans(conn: Memory, model: Model, statement: str):
    from psycopg import sql

    return conn.execute(
        sql.SQL(statement).format(table=sql.Identifier(model.table_name)),
        {"id": model.id},
        prepare=False,
    )


def count_orphans(conn: Memory, model: Model) -> int:
    """Chunks that will never get a vector of this model unless re-queued (see ORPHANS)."""
    return _orphans(conn, model, COUNT_ORPHANS).fetchone()["n"]


def queue_orphans(conn: Memory, model: Model) -> int:
    """Queue every orphaned chunk of this model; returns how many."""
    return _orphans(conn, model, QUEUE_ORPHANS).rowcount


def index_statement(model: Model, *, concurrently: bool):
    from psycopg import sql

    return sql.SQL(template("vectors_index.sql")).format(
        concurrently=sql.SQL("CONCURRENTLY" if concurrently else ""),
        index=sql.Identifier(model.index_name),
        table=sql.Identifier(model.table_name),
        ops=sql.SQL(model.ops),
    )


def instructions(embedder) -> tuple[str, str]:
    return getattr(embedder, "query_prefix", "") or "", getattr(
        embedder, "document_prefix", ""
    ) or ""


def same_network(model: Model, embedder) -> bool:
    """The same model at the same size, whatever instructions it is given."""
    return (
        model.embedder == embedder.name
        and model.model == embedder.model
        and (embedder.request_dims is None or embedder.request_dims == model.dims)
    )


def matches(model: Model, embedder) -> bool:
    """The embedder makes this model's vectors: the same network, size and instructions (DESIGN 12).

    Vectors of one network made with other instructions are another model's: they never go in this
    model's table (the embed worker then embeds with the registered model's own instructions).
    """
    return same_network(model, embedder) and instructions(embedder) == (
        model.query_prefix,
        model.document_prefix,
    )


def _shown(prefix: str) -> str:
    return repr(prefix) if prefix else "none"


def instruction_warning(model: Model, expected: tuple[str, str]) -> str | None:
    """One line when the active model's vectors were made with other instructions than the model
    card's (or the configuration's) for it: most often a database embedded before memctl gave
    nomic-embed-text its 'search_document: ', whose search finds less than the model can.
    """
    made = (model.query_prefix, model.document_prefix)
    if made == tuple(expected):
        return None
    return (
        f"the active model {model.label} was embedded with query instruction {_shown(made[0])} and document "
        f"instruction {_shown(made[1])}, but {model.model} expects {_shown(expected[0])} and "
        f"{_shown(expected[1])}: search finds less than it could. One re-embed fixes it (search keeps "
        f"working meanwhile): memctl reembed start --model {model.model} && memctl reembed run && "
        "memctl reembed switch"
    )


def mismatch_warning(model: Model, embedder) -> str | None:
    """One line when the configuration names another model than the database's active one.

    Not a refusal: search, recall and the embed worker follow the database (which knows
    what its vectors were made with), so a model switch does not break every process
    still configured with the old model.
    """
    if same_network(model, embedder):  # other instructions only: `memctl status` says so
        return None
    return (
        f"the configuration names {embedder.name}:{embedder.model}, but the database's active model is "
        f"{model.label}: using {model.embedder}:{model.model}. To change models: "
        f"`memctl reembed start --model {embedder.model}` (see `memctl reembed --help`); to silence this, "
        f"set MEMCTL_EMBEDDER={model.embedder} MEMCTL_EMBED_MODEL={model.model}."
    )


def require_active(conn: Memory) -> Model:
    model = active(conn)
    if model is None:
        raise MemctlError(
            "no embedding model yet: run `memctl embed` once to register the configured model"
        )
    return model


def ensure_active(conn: Memory, embedder, *, storage: str = "vector") -> Model:
    """The active model, registering the configured one on first use.

    Registration runs under the registry lock, so of two workers configured differently
    on an empty database the first registers and the second gets the first's model.
    """
    model = active(conn)
    if model is None:
        model = register(conn, embedder, state="active", storage=storage)
    return model


RETIRE_ACTIVE = (
    f"UPDATE embedding_models SET state = 'retired' WHERE state = 'active' RETURNING {COLUMNS}"  # noqa: S608
)
ACTIVATE = "UPDATE embedding_models SET state = 'active', activated_at = now() WHERE id = %s AND state = 'backfill'"
CLEAR_QUEUE = "DELETE FROM embed_queue WHERE model_id = %s"
DELETE_MODEL = "DELETE FROM embedding_models WHERE id = %s"


def activate(conn: Memory, model: Model) -> Model | None:
    """Make a backfilled model the active one; the old active model is retired (returned).

    Runs inside the caller's transaction, under the registry lock. Chunks still queued for
    the retired model are dropped from the queue: nothing embeds a retired model.
    """
    if model.state != "backfill":
        raise MemctlError(f"{model.label} is {model.state}, not being backfilled")
    conn.execute(locks.LOCK)  # the caller began its transaction with lock_registry
    row = conn.execute(RETIRE_ACTIVE).fetchone()
    if conn.execute(ACTIVATE, (model.id,)).rowcount != 1:
        raise MemctlError(f"{model.label} is no longer being backfilled")
    old = Model(**row) if row else None
    if old is not None:
        conn.execute(CLEAR_QUEUE, (old.id,))
    return old


def remove(conn: Memory, model: Model) -> None:
    """Drop a retired or backfilling model's vector table and its row (queue and failures cascade)."""
    from psycopg import sql

    if model.state == "active":
        raise MemctlError(f"{model.label} is the active model: it cannot be dropped")
    lock_registry(conn)
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(model.table_name)))
    conn.execute(DELETE_MODEL, (model.id,))
