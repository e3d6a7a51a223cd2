"""Citus: memctl's tables distributed by agent, co-located, on a coordinator (`memctl db distribute`).

Every table keyed by agent (its primary key and foreign keys carry `agent`) becomes a distributed
table in episodes' co-location group, so an episode, its chunks, their vectors, queue entries,
failures, access record and summary lineage live on one shard and a query filtered by agent is
routed to it. Small shared tables become reference tables (a copy on every node). Distributing is
idempotent: a table already as wanted is left alone; one distributed otherwise is refused.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from psycopg import sql

from memctl.errors import MemctlError

if TYPE_CHECKING:
    from memctl.db.memory import Memory


class NotCitus(MemctlError):
    """The database is not a Citus coordinator."""


# Distributed tables first, in foreign-key order, then the reference tables. A plain table may not reference
# a reference table (Citus would turn the whole foreign-key graph into Citus local tables, and refuses to for
# tables with identity columns), so the foreign keys from distributed to reference tables (embed_queue and
# embed_failures -> embedding_models) are dropped for the move and added back after it, in one transaction.
DISTRIBUTED = (
    "episodes",
    "chunks",
    "embed_queue",
    "embed_failures",
    "episode_access",
    "summary_sources",
    "runbook_runs",
)
REFERENCE = ("memctl_migrations", "embedding_models", "blocked_sources")
# Left as plain tables on the coordinator: not keyed by agent, never joined with the distributed tables,
# and written with now() in ON CONFLICT ... DO UPDATE, which Citus refuses on reference tables.
COORDINATOR_ONLY = (
    "facts",
    "fact_history",
    "jobs",
    "ingest_cursors",
    "erasures",
    "erasure_digests",
    "fold_key",
    "agents",
    "memctl_lock_models",
    "memctl_lock_sources",
    "memctl_lock_keys",
)  # the last three: memctl.db.locks
ANCHOR = "episodes"  # the co-location group's first table
COLUMN = "agent"

CITUS_VERSION = "SELECT extversion FROM pg_extension WHERE extname = 'citus'"
IS_COORDINATOR = "SELECT citus_is_coordinator() AS yes"
STATE = """
SELECT c.relname AS name, p.partmethod AS method,
       CASE WHEN p.partmethod = 'h' THEN column_to_column_name(p.logicalrelid, p.partkey) END AS column_name,
       p.colocationid, p.repmodel
FROM pg_class c JOIN pg_dist_partition p ON p.logicalrelid = c.oid
WHERE c.relnamespace = current_schema()::regnamespace
"""
PRESENT = "SELECT relname FROM pg_class WHERE relnamespace = current_schema()::regnamespace AND relkind = 'r'"
VECTOR_TABLES = "SELECT table_name FROM embedding_models ORDER BY id"
# Foreign keys from a table about to be distributed to one about to be a reference table.
CROSS_KEYS = """
SELECT c.conname, s.relname AS source, pg_get_constraintdef(c.oid) AS definition
FROM pg_constraint c
JOIN pg_class s ON s.oid = c.conrelid
JOIN pg_class t ON t.oid = c.confrelid
WHERE c.contype = 'f' AND s.relnamespace = current_schema()::regnamespace
  AND s.relname = ANY(%s) AND t.relname = ANY(%s)
"""
CREATE_REFERENCE = "SELECT create_reference_table(%s)"
CREATE_DISTRIBUTED = "SELECT create_distributed_table(%s, %s, colocate_with => %s)"
TRUNCATE_LOCAL = "SELECT truncate_local_data_after_distributing_table(%s)"


@dataclass
class Placement:
    table: str
    type: str  # distributed, reference, or coordinator (a plain table left there)
    action: str  # done now, already, or kept

    def to_dict(self) -> dict:
        return asdict(self)


def citus_version(conn: Memory) -> str | None:
    row = conn.execute(CITUS_VERSION).fetchone()
    return row["extversion"] if row else None


def require_coordinator(conn: Memory) -> str:
    """Citus's version, or NotCitus saying what is missing."""
    version = citus_version(conn)
    if version is None:
        raise NotCitus(
            "not a Citus database: the extension citus is not created here (a Citus server needs "
            "shared_preload_libraries = 'citus', then CREATE EXTENSION citus in this database on "
            "the coordinator and every worker)"
        )
    if not conn.one(IS_COORDINATOR)["yes"]:
        raise NotCitus(
            "this Citus node is not the coordinator: run memctl db distribute against the coordinator"
        )
    return version


# Tables whose primary key carries agent: a table a later migration adds is distributed without being named here.
KEYED_BY_AGENT = """
SELECT c.relname FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY(k.conkey)
WHERE k.contype = 'p' AND c.relnamespace = current_schema()::regnamespace AND a.attname = 'agent'
ORDER BY c.relname
"""


def plan(conn: Memory) -> list[tuple[str, str]]:
    """(table, type) for every memctl table present, in the order they must be placed."""
    present = {row["relname"] for row in conn.execute(PRESENT)}
    vectors = (
        [row["table_name"] for row in conn.execute(VECTOR_TABLES)]
        if "embedding_models" in present
        else []
    )
    known = [*DISTRIBUTED[:2], *vectors, *DISTRIBUTED[2:]]
    later = [row["relname"] for row in conn.execute(KEYED_BY_AGENT) if row["relname"] not in known]
    wanted = [(t, "distributed") for t in (*known, *later)] + [(t, "reference") for t in REFERENCE]
    return [(table, kind) for table, kind in wanted if table in present]


def distribute(conn: Memory) -> list[Placement]:
    """Make memctl's tables reference or distributed tables as planned; the placements, in order.

    Runs on the coordinator; data already in a table is moved to its shards and the coordinator's
    local copy truncated.
    """
    require_coordinator(conn)
    if "episodes" not in {row["relname"] for row in conn.execute(PRESENT)}:
        raise MemctlError("no memctl schema here yet: run memctl db migrate first")
    with conn.transaction():
        # foreign keys to reference tables need one connection per node within a transaction
        conn.execute("SET LOCAL citus.multi_shard_modify_mode TO 'sequential'")
        return _distribute(conn)


def _distribute(conn: Memory) -> list[Placement]:
    done = {row["name"]: row for row in conn.execute(STATE)}
    anchor = done.get(ANCHOR)
    placements, moved = [], []
    steps = plan(conn)
    todo = [t for t, _ in steps if t not in done or _citus_local(done[t])]
    cross = conn.execute(
        CROSS_KEYS,
        (
            [t for t, k in steps if k == "distributed" and t in todo],
            [t for t, k in steps if k == "reference" and t in todo],
        ),
    ).fetchall()
    for key in cross:
        conn.execute(
            sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(
                sql.Identifier(key["source"]), sql.Identifier(key["conname"])
            )
        )
    for table, kind in steps:
        current = done.get(table)
        if current is not None and not _citus_local(current):
            _check(table, kind, current, anchor)
            placements.append(Placement(table, kind, "already"))
            continue
        if kind == "reference":
            conn.execute(CREATE_REFERENCE, (table,))
        else:
            conn.execute(
                CREATE_DISTRIBUTED, (table, COLUMN, "default" if table == ANCHOR else ANCHOR)
            )
            if table == ANCHOR:
                anchor = {row["name"]: row for row in conn.execute(STATE)}[ANCHOR]
        moved.append(table)
        placements.append(Placement(table, kind, "done"))
    for key in cross:  # the definition is the server's own text for a constraint it had
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(
                sql.Identifier(key["source"]),
                sql.Identifier(key["conname"]),
                sql.SQL(key["definition"]),
            )
        )
    for table in reversed(
        moved
    ):  # the coordinator's local copy of the rows moved; sources of foreign keys first
        conn.execute(TRUNCATE_LOCAL, (table,))
    present = {row["relname"] for row in conn.execute(PRESENT)}
    placements += [Placement(t, "coordinator", "kept") for t in COORDINATOR_ONLY if t in present]
    return placements


def _citus_local(row: dict) -> bool:
    """A table Citus tracks on the coordinator alone (made so by a foreign key to a reference table)."""
    return row["method"] == "n" and row["repmodel"] == "s"


def _check(table: str, kind: str, current: dict, anchor: dict | None) -> None:
    if kind == "reference" and current["method"] == "n" and current["repmodel"] == "t":
        return
    if (
        kind == "distributed"
        and current["method"] == "h"
        and current["column_name"] == COLUMN
        and anchor is not None
        and current["colocationid"] == anchor["colocationid"]
    ):
        return
    raise MemctlError(
        f"{table} is already a Citus table, but not a {kind} table"
        f"{' distributed by agent and co-located with episodes' if kind == 'distributed' else ''}: "
        f"undistribute it (SELECT undistribute_table('{table}')) and run memctl db distribute again"
    )


DISTRIBUTED_TABLE = """
SELECT 1 FROM pg_dist_partition
WHERE logicalrelid = to_regclass(quote_ident(%s)) AND partmethod = 'h'
"""


def is_distributed(conn: Memory, table: str = ANCHOR) -> bool:
    """Whether `table` is a distributed table here (False on a server without Citus)."""
    if citus_version(conn) is None:
        return False
    return conn.execute(DISTRIBUTED_TABLE, (table,)).fetchone() is not None


def adopt(conn: Memory, table: str) -> bool:
    """Distribute a table memctl just created (a new model's vector table) when episodes is distributed.

    For the code that creates such tables (models.register); False on a single server. Tables a
    migration adds are placed by `memctl db migrate`, which runs distribute() again on a cluster.
    """
    if citus_version(conn) is None:
        return False
    anchor = {row["name"]: row for row in conn.execute(STATE)}.get(ANCHOR)
    if anchor is None:
        return False
    conn.execute(CREATE_DISTRIBUTED, (table, COLUMN, ANCHOR))
    return True


# Bytes per memctl table and node, shards included (citus_shards.shard_size is each shard's
# pg_total_relation_size on its node; a reference table has a copy on every node).
NODE_SIZES = """
SELECT s.table_name::text AS "table", s.citus_table_type AS type, s.nodename || ':' || s.nodeport AS node,
       count(*) AS shards, sum(s.shard_size)::bigint AS bytes
FROM citus_shards s JOIN pg_class c ON c.oid = s.table_name
WHERE c.relnamespace = current_schema()::regnamespace
GROUP BY 1, 2, 3 ORDER BY 1, 3
"""
TOTAL_SIZE = "SELECT citus_total_relation_size(%s) AS bytes"
CITUS_TABLE = "SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass(quote_ident(%s))"
LOCAL_SIZE = "SELECT coalesce(pg_total_relation_size(to_regclass(quote_ident(%s))), 0) AS bytes"


def node_sizes(conn: Memory) -> list[dict]:
    """What memctl's Citus tables cost on each node: table, type, node (host:port), shards, bytes."""
    return conn.execute(NODE_SIZES).fetchall()


def total_size(conn: Memory, table: str) -> int:
    """citus_total_relation_size: the table's shards on every node, indexes and TOAST included (one copy)."""
    return conn.one(TOTAL_SIZE, (table,))["bytes"]


def relation_size(conn: Memory, table: str) -> int:
    """A table's bytes with indexes and TOAST: its shards' on Citus, pg_total_relation_size otherwise (0 if absent)."""
    if (
        citus_version(conn) is not None
        and conn.execute(CITUS_TABLE, (table,)).fetchone() is not None
    ):
        return total_size(conn, table)
    return conn.one(LOCAL_SIZE, (table,))["bytes"]


# One shard placement's figures, run on its node (run_command_on_placements puts the shard's name
# for %s): the heap, TOAST, every index (by its name without the shard id suffix), the statistics.
PLACEMENT_FIGURES = """
SELECT json_build_object(
    'heap', pg_relation_size(t.oid), 'toast', coalesce(pg_total_relation_size(nullif(t.reltoastrelid, 0)), 0),
    'indexes_total', pg_indexes_size(t.oid), 'total', pg_total_relation_size(t.oid),
    'live', s.n_live_tup, 'dead', s.n_dead_tup,
    'indexes', (SELECT json_object_agg(regexp_replace(i.relname, '_[0-9]+$', ''), pg_relation_size(i.oid))
                FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid WHERE x.indrelid = t.oid))
FROM pg_class t LEFT JOIN pg_stat_all_tables s ON s.relid = t.oid WHERE t.oid = '%s'::regclass
"""
PLACEMENTS = (
    "SELECT shardid, nodename, nodeport, success, result FROM run_command_on_placements(%s, %s)"
)
CITUS_TABLES = """
SELECT c.relname AS name, p.partmethod AS method FROM pg_class c JOIN pg_dist_partition p ON p.logicalrelid = c.oid
WHERE c.relnamespace = current_schema()::regnamespace ORDER BY 1
"""


def placement_figures(conn: Memory) -> dict[str, dict]:
    """Per Citus table of memctl's schema, its bytes summed over every shard placement on every node.

    {table: {type, shards, placements, nodes, heap_bytes, toast_bytes, index_bytes, total_bytes,
    live_tuples (one copy of each shard), dead_tuples (every copy), indexes: {name: bytes}}}; the
    totals equal citus_total_relation_size (a reference table counts its copy on every node).
    Empty on a server without Citus.
    """
    import json

    if citus_version(conn) is None:
        return {}
    out = {}
    for table in conn.execute(CITUS_TABLES).fetchall():
        rows = conn.execute(
            PLACEMENTS, (table["name"], PLACEMENT_FIGURES), prepare=False
        ).fetchall()
        failed = [r for r in rows if not r["success"]]
        if failed:
            raise MemctlError(
                f"reading {table['name']}'s shard on {failed[0]['nodename']}:{failed[0]['nodeport']} "
                f"failed: {failed[0]['result']}"
            )
        figures: dict[str, Any] = {
            "type": "distributed" if table["method"] == "h" else "reference",
            "shards": 0,
            "placements": len(rows),
            "nodes": len({(r["nodename"], r["nodeport"]) for r in rows}),
            "heap_bytes": 0,
            "toast_bytes": 0,
            "index_bytes": 0,
            "total_bytes": 0,
            "live_tuples": 0,
            "dead_tuples": 0,
            "indexes": {},
        }
        seen = set()
        for r in rows:
            one = json.loads(r["result"])
            for key, name in (
                ("heap", "heap_bytes"),
                ("toast", "toast_bytes"),
                ("indexes_total", "index_bytes"),
                ("total", "total_bytes"),
                ("dead", "dead_tuples"),
            ):
                figures[name] += one[key] or 0
            if r["shardid"] not in seen:  # live rows: one copy of each shard
                seen.add(r["shardid"])
                figures["live_tuples"] += one["live"] or 0
            for index, size in (one["indexes"] or {}).items():
                figures["indexes"][index] = figures["indexes"].get(index, 0) + size
        figures["shards"] = len(seen)
        out[table["name"]] = figures
    return out
