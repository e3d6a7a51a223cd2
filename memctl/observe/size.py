"""What memory costs on disk: a size report read from PostgreSQL (estimates before any data are
memctl.embedding.footprint).

The report (`report`) has one row per memctl relation: every table in the schema
that holds memctl's migration record, each table's TOAST table, and every index
of both. Each figure is a PostgreSQL function an operator can run in psql on the
same `relation` name, and none needs more than owning memctl's tables (no
superuser, no pg_read_all_stats, no read of pg_toast):

    rows         SELECT count(*) FROM <relation>                (rows_source 'exact': a table whose heap
                                                                 is at most 64 MiB, or any with --exact)
                 pg_stat_all_tables.n_live_tup, else pg_class.reltuples
                                                                (rows_source 'estimate': TOAST tables, which
                                                                 only a superuser may count, larger tables,
                                                                 tables this role may not read; 'unknown' and
                                                                 rows None when neither exists); `note` says why
    heap_bytes   pg_relation_size(<relation>)                   (main fork only)
    toast_bytes  pg_total_relation_size(<toast relation>)       (TOAST heap and its index)
    index_bytes  pg_indexes_size(<relation>), for an index row pg_relation_size(<index>)
    map_bytes    free space map + visibility map (+ init fork):
                 pg_total_relation_size - heap - toast - index
    total_bytes  pg_total_relation_size(<relation>)
    dead_tuples  pg_stat_all_tables.n_dead_tup                  (statistics, as psql shows them)

The kinds and agents sections sum pg_column_size over episodes, chunks and vectors:
every row while episodes is counted exactly; once it is estimated (a large table),
over a Bernoulli sample of about GROUP_SAMPLE_ROWS episodes scaled by 100/percent
(rows_source 'estimate', sample_percent). Measured on PostgreSQL 18.6 at 1M episodes
(one chunk and one 384-dim vector each, 2.1 GB): the whole report 1.0-1.4 s, with
--exact 8-14 s; the sampled kinds and agents within 1.5% of the exact figures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memctl.embedding import models
from memctl.embedding.footprint import MIB, build_memory, build_warning, bytes_per_vector

if TYPE_CHECKING:
    from memctl.db.memory import Memory

SCHEMA = (
    "SELECT coalesce((SELECT relnamespace FROM pg_class WHERE oid = to_regclass('memctl_migrations')), "
    "(SELECT oid FROM pg_namespace WHERE nspname = current_schema())) AS oid"
)
TABLES = """
SELECT c.oid, format('%%I.%%I', n.nspname, c.relname) AS relation, n.nspname AS schema, c.relname AS name,
       nullif(c.reltoastrelid, 0) AS toast_oid, t.relname AS toast_name,
       pg_relation_size(c.oid) AS heap_bytes,
       coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0) AS toast_bytes,
       pg_indexes_size(c.oid) AS index_bytes,
       pg_total_relation_size(c.oid) AS total_bytes,
       s.n_dead_tup AS dead_tuples, s.n_live_tup AS live_tuples, c.reltuples,
       has_table_privilege(c.oid, 'SELECT') AS readable
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_class t ON t.oid = c.reltoastrelid
LEFT JOIN pg_stat_all_tables s ON s.relid = c.oid
WHERE c.relnamespace = %s AND c.relkind IN ('r', 'p')
ORDER BY c.relname
"""
TOAST = """
SELECT format('%%I.%%I', n.nspname, t.relname) AS relation, n.nspname AS schema, t.relname AS name,
       pg_relation_size(t.oid) AS heap_bytes, pg_indexes_size(t.oid) AS index_bytes,
       pg_total_relation_size(t.oid) AS total_bytes, s.n_dead_tup AS dead_tuples,
       s.n_live_tup AS live_tuples, t.reltuples
FROM pg_class t JOIN pg_namespace n ON n.oid = t.relnamespace
LEFT JOIN pg_stat_all_tables s ON s.relid = t.oid
WHERE t.oid = %s
"""
INDEXES = """
SELECT i.indrelid AS table_oid, format('%%I.%%I', n.nspname, c.relname) AS relation, c.relname AS name,
       pg_relation_size(c.oid) AS index_bytes, pg_total_relation_size(c.oid) AS total_bytes,
       i.indisvalid AS valid, a.amname AS method
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_am a ON a.oid = c.relam
WHERE i.indrelid = ANY(%s)
ORDER BY c.relname
"""
COUNT = "SELECT count(*) AS n FROM {}"
MAINTENANCE_WORK_MEM = "SELECT pg_size_bytes(current_setting('maintenance_work_mem')) AS bytes"
MEASURED_VECTOR = (
    "SELECT avg(pg_column_size(subvector(embedding, 1, {dims}))) AS bytes "
    "FROM (SELECT embedding FROM {table} LIMIT 1000) s"
)
GROWTH = """
SELECT count(*) FILTER (WHERE created_at >= now() - interval '7 days') AS last_7d, count(*) AS last_30d
FROM episodes WHERE created_at >= now() - interval '30 days'
"""
BY_GROUP_EPISODES = """
SELECT e.kind, e.agent, count(*) AS episodes, 0 AS chunks, coalesce(sum(pg_column_size(e.*)), 0) AS bytes
FROM episodes e GROUP BY 1, 2
"""
BY_GROUP_CHUNKS = """
SELECT e.kind, e.agent, count(*) AS chunks, coalesce(sum(pg_column_size(c.*)), 0) AS bytes
FROM chunks c JOIN episodes e ON e.agent = c.agent AND e.id = c.episode_id GROUP BY 1, 2
"""
BY_GROUP_VECTORS = """
SELECT e.kind, e.agent, 0 AS chunks, coalesce(sum(pg_column_size(v.*)), 0) AS bytes
FROM {table} v JOIN chunks c ON c.agent = v.agent AND c.id = v.chunk_id
JOIN episodes e ON e.agent = c.agent AND e.id = c.episode_id GROUP BY 1, 2
"""
# A Bernoulli sample of episodes, each one's chunks and vectors looked up by index (the subqueries keep the
# planner from hash-joining whole tables, which would cost what the sample saves).
BY_GROUP_SAMPLED = """
SELECT kind, agent, count(*) AS episodes, sum(chunks)::bigint AS chunks, sum(bytes)::bigint AS bytes FROM (
    SELECT e.kind, e.agent,
           (SELECT count(*) FROM chunks c WHERE c.agent = e.agent AND c.episode_id = e.id) AS chunks,
           pg_column_size(e.*)
           + (SELECT coalesce(sum(pg_column_size(c.*)), 0) FROM chunks c
              WHERE c.agent = e.agent AND c.episode_id = e.id) {vectors} AS bytes
    FROM episodes e TABLESAMPLE BERNOULLI ({percent}) REPEATABLE (0)
) s GROUP BY 1, 2
"""
SAMPLED_VECTORS = """
           + (SELECT coalesce(sum(pg_column_size(v.*)), 0) FROM chunks c
              JOIN {table} v ON v.agent = c.agent AND v.chunk_id = c.id
              WHERE c.agent = e.agent AND c.episode_id = e.id)"""
GROUP_SAMPLE_ROWS = (
    20_000  # episodes read for the kinds and agents sections once episodes is too large to count
)
PROJECTION_DAYS = (30, 90, 365)
EXACT_MAX_BYTES = (
    64 * MIB
)  # count(*) scans the heap: up to this size it stays quick, beyond it the report estimates
NOTE_TOAST = (
    "TOAST table: only a superuser may read pg_toast, so rows are the statistics' n_live_tup"
)
NOTE_LARGE = "heap over {mib} MiB: rows are the statistics' estimate (size --exact counts)"
NOTE_UNREADABLE = "no SELECT privilege on this table: rows are the statistics' estimate"
NOTE_UNKNOWN = "no statistics yet (never vacuumed or analyzed, statistics reset)"


def _count(conn: Memory, schema: str, name: str) -> int:
    from psycopg import sql

    return conn.one(sql.SQL(COUNT).format(sql.Identifier(schema, name)), prepare=False)["n"]


def _estimate(live: int | None, reltuples: float | None) -> int | None:
    """n_live_tup (kept current by every insert and delete), else pg_class.reltuples (-1: never vacuumed)."""
    if live:
        return int(live)
    if reltuples is not None and reltuples >= 0:
        return int(reltuples)
    return live  # 0 from the statistics, or None


def row_count(
    conn: Memory, rel: dict, *, countable: bool, exact: bool = False
) -> tuple[int | None, str, str | None]:
    """(rows, 'exact' | 'estimate' | 'unknown', why it is not exact)."""
    if not countable:
        note = NOTE_TOAST
    elif not rel["readable"]:
        note = NOTE_UNREADABLE
    elif exact or rel["heap_bytes"] <= EXACT_MAX_BYTES:
        return _count(conn, rel["schema"], rel["name"]), "exact", None
    else:
        note = NOTE_LARGE.format(mib=EXACT_MAX_BYTES // MIB)
    rows = _estimate(rel["live_tuples"], rel["reltuples"])
    if rows is None:
        return None, "unknown", NOTE_UNKNOWN
    return rows, "estimate", note


def _relations(conn: Memory, exact: bool = False) -> tuple[list[dict], dict[str, str]]:
    """The report rows, and each relation's bare name (to find a model's table and index)."""
    from memctl.db import cluster

    schema = conn.one(SCHEMA)["oid"]
    vector_tables = {m.table_name for m in models.all_models(conn)}
    tables = conn.execute(TABLES, (schema,)).fetchall()
    citus = cluster.placement_figures(conn)  # on Citus the coordinator's tables are empty shells
    toast = {t["toast_oid"]: conn.one(TOAST, (t["toast_oid"],)) for t in tables if t["toast_oid"]}
    indexes = conn.execute(INDEXES, ([t["oid"] for t in tables] + list(toast),)).fetchall()
    names = {r["relation"]: r["name"] for r in [*tables, *toast.values(), *indexes]}
    rows: list[dict] = []
    for t in tables:
        kind = "vectors" if t["name"] in vector_tables else "table"
        if t["name"] in citus:
            rows.extend(_citus_rows(conn, t, kind, citus[t["name"]], indexes, exact))
            continue
        rows.append(
            _row(
                t["relation"],
                kind,
                None,
                row_count(conn, t, countable=True, exact=exact),
                t["heap_bytes"],
                t["toast_bytes"],
                t["index_bytes"],
                t["total_bytes"],
                t["dead_tuples"],
            )
        )
        rows.extend(_index_rows(indexes, t["oid"], t["relation"]))
        if t["toast_oid"]:
            x = toast[t["toast_oid"]]
            rows.append(
                _row(
                    x["relation"],
                    "toast",
                    t["relation"],
                    row_count(conn, x, countable=False),
                    x["heap_bytes"],
                    0,
                    x["index_bytes"],
                    x["total_bytes"],
                    x["dead_tuples"],
                )
            )
            rows.extend(_index_rows(indexes, t["toast_oid"], x["relation"]))
    return rows, names


NOTE_CITUS = (
    "Citus {type} table: bytes and dead tuples summed over its {placements} shard placement(s) on "
    "{nodes} node(s) (size --section nodes per node); TOAST is in toast_bytes"
)


def _citus_rows(
    conn: Memory, table: dict, kind: str, figures: dict, indexes: list[dict], exact: bool
) -> list[dict]:
    """A Citus table's row and its indexes' rows, from its shards on the workers (cluster.placement_figures)."""
    shards = {
        **table,
        "heap_bytes": figures["heap_bytes"],
        "live_tuples": figures["live_tuples"],
        "reltuples": None,
    }
    rows_, source, note = row_count(conn, shards, countable=True, exact=exact)
    where = NOTE_CITUS.format(**figures)
    row = _row(
        table["relation"],
        kind,
        None,
        (rows_, source, f"{note}; {where}" if note else where),
        figures["heap_bytes"],
        figures["toast_bytes"],
        figures["index_bytes"],
        figures["total_bytes"],
        figures["dead_tuples"],
    )
    out = [row]
    for index in _index_rows(indexes, table["oid"], table["relation"]):
        size = figures["indexes"].get(index["relation"].rsplit(".", 1)[-1].strip('"'))
        out.append({**index, "index_bytes": size, "total_bytes": size})
    return out


def relations(conn: Memory, exact: bool = False) -> list[dict]:
    """One row per memctl table, its TOAST table, and every index of both (see the module docstring)."""
    return _relations(conn, exact)[0]


def _row(relation, kind, parent, counted, heap, toast, index, total, dead) -> dict:
    count, source, note = counted
    return {
        "relation": relation,
        "kind": kind,
        "parent": parent,
        "rows": count,
        "heap_bytes": heap,
        "toast_bytes": toast,
        "index_bytes": index,
        "map_bytes": total - heap - toast - index,
        "total_bytes": total,
        "dead_tuples": dead,
        "rows_source": source,
        "note": note,
    }


def _index_rows(indexes: list[dict], table_oid: int, parent: str) -> list[dict]:
    return [
        {
            "relation": i["relation"],
            "kind": "index",
            "parent": parent,
            "rows": None,
            "heap_bytes": None,
            "toast_bytes": None,
            "index_bytes": i["index_bytes"],
            "map_bytes": None,
            "total_bytes": i["total_bytes"],
            "dead_tuples": None,
            "rows_source": None,
            "note": None,
        }
        for i in indexes
        if i["table_oid"] == table_oid
    ]


def maintenance_work_mem(conn: Memory) -> int:
    return conn.one(MAINTENANCE_WORK_MEM)["bytes"]


def _model_rows(
    conn: Memory, rels: list[dict], names: dict[str, str], limit: int
) -> tuple[list[dict], list[str]]:
    from psycopg import sql

    result, warnings = [], []
    for model in models.all_models(conn):
        rel = next(
            (
                r
                for r in rels
                if r["kind"] == "vectors" and names[r["relation"]] == model.table_name
            ),
            None,
        )
        if rel is None:
            continue
        count = rel["rows"]
        measured = None
        if count:
            statement = sql.SQL(MEASURED_VECTOR).format(
                dims=sql.Literal(model.dims), table=sql.Identifier(model.table_name)
            )
            measured = conn.one(statement, prepare=False)["bytes"]
        hnsw = next(
            (
                r
                for r in rels
                if r["kind"] == "index"
                and r["parent"] == rel["relation"]
                and names[r["relation"]] == model.index_name
            ),
            None,
        )
        warning = build_warning(model, count, limit) if count is not None else None
        if warning:
            warnings.append(warning)
        result.append(
            {
                "model": model.label,
                "state": model.state,
                "relation": rel["relation"],
                "rows": count,
                "rows_source": rel["rows_source"],
                "dims": model.dims,
                "storage": model.storage,
                "bytes_per_vector": bytes_per_vector(model.dims, model.storage),
                "measured_bytes_per_vector": round(float(measured), 1)
                if measured is not None
                else None,
                "table_bytes_per_row": round((rel["total_bytes"] - rel["index_bytes"]) / count, 1)
                if count
                else None,
                "index_bytes": hnsw["total_bytes"] if hnsw else None,
                "total_bytes": rel["total_bytes"],
                "build_mem_bytes": build_memory(count, model.dims, model.storage)
                if count is not None
                else None,
                "maintenance_work_mem": limit,
            }
        )
    return result, warnings


def sample_percent(episodes: dict, exact: bool) -> float | None:
    """The share of episodes the kinds and agents sections read: None (all) unless episodes is estimated."""
    if exact or episodes["rows_source"] == "exact" or not episodes["rows"]:
        return None
    percent = 100.0 * GROUP_SAMPLE_ROWS / episodes["rows"]
    return round(percent, 4) if percent < 100 else None


def _pairs(conn: Memory, percent: float | None) -> list[dict]:
    """Episodes, chunks and data bytes per (kind, agent): every row, or a Bernoulli sample of `percent` %."""
    from psycopg import sql

    tables = [sql.Identifier(m.table_name) for m in models.all_models(conn)]
    if percent:
        vectors = sql.SQL("").join(sql.SQL(SAMPLED_VECTORS).format(table=t) for t in tables)
        return conn.execute(
            sql.SQL(BY_GROUP_SAMPLED).format(vectors=vectors, percent=sql.Literal(percent)),
            prepare=False,
        ).fetchall()
    rows = conn.execute(BY_GROUP_EPISODES).fetchall()
    rows += [{**r, "episodes": 0} for r in conn.execute(BY_GROUP_CHUNKS).fetchall()]
    for table in tables:
        rows += [
            {**r, "episodes": 0}
            for r in conn.execute(
                sql.SQL(BY_GROUP_VECTORS).format(table=table), prepare=False
            ).fetchall()
        ]
    return rows


def _rollup(pairs: list[dict], column: str, percent: float | None) -> list[dict]:
    """One section (per kind or per agent) from the (kind, agent) rows, scaled by 100/percent for a sample."""
    scale = 100.0 / percent if percent else 1
    out: dict[str, dict] = {}
    for row in pairs:
        group = out.setdefault(
            row[column], {column: row[column], "episodes": 0, "chunks": 0, "bytes": 0}
        )
        for key in ("episodes", "chunks", "bytes"):
            group[key] += row[key]
    for group in out.values():
        for key in ("episodes", "chunks", "bytes"):
            group[key] = int(round(group[key] * scale))
        group["rows_source"], group["sample_percent"] = (
            ("estimate", percent) if percent else ("exact", None)
        )
    return sorted(out.values(), key=lambda r: (-r["bytes"], r[column]))


def growth(conn: Memory, rels: list[dict], names: dict[str, str]) -> dict:
    """Rows per day over 7 and 30 days, and projected total size.

    projected_bytes_<N>d = total_bytes + rows_per_day_30d * bytes_per_episode * N, where
    total_bytes sums pg_total_relation_size of every memctl table and bytes_per_episode is
    the total size (heap, TOAST, indexes) of episodes, chunks and the vector tables of the
    models not retired, divided by the number of episodes (that table's `rows`, exact or estimated
    as the relations section says). The 7- and 30-day counts use the created_at index.
    """
    counts = conn.one(GROWTH)
    episodes = next(r for r in rels if r["kind"] == "table" and names[r["relation"]] == "episodes")
    counts["episodes"] = episodes["rows"]
    per_episode_tables = {"episodes", "chunks"} | {
        m.table_name for m in models.all_models(conn) if m.state != "retired"
    }
    tables = [r for r in rels if r["kind"] in ("table", "vectors")]
    total = sum(r["total_bytes"] for r in tables)
    episode_bytes = sum(
        r["total_bytes"] for r in tables if names[r["relation"]] in per_episode_tables
    )
    per_episode = episode_bytes / counts["episodes"] if counts["episodes"] else 0.0
    rate_7, rate_30 = counts["last_7d"] / 7, counts["last_30d"] / 30
    report = {
        "episodes": counts["episodes"],
        "episodes_source": episodes["rows_source"],
        "last_7d": counts["last_7d"],
        "last_30d": counts["last_30d"],
        "rows_per_day_7d": round(rate_7, 2),
        "rows_per_day_30d": round(rate_30, 2),
        "bytes_per_episode": round(per_episode, 1),
        "total_bytes": total,
    }
    for days in PROJECTION_DAYS:
        report[f"projected_bytes_{days}d"] = int(round(total + rate_30 * per_episode * days))
    return report


# What a person reads first: the total, then these groups of tables (each with its TOAST and indexes).
GROUPS = (
    ("episodes", ("episodes",)),
    ("chunks", ("chunks",)),
    ("facts", ("facts", "fact_history")),
)
UNITS = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(count: int | None) -> str:
    """1536 -> '1.5 KiB': binary units, three significant figures (as `du -h` and psql's pg_size_pretty read)."""
    if count is None:
        return "?"
    size, unit = float(count), 0
    while size >= 1024 and unit < len(UNITS) - 1:
        size, unit = size / 1024, unit + 1
    if unit == 0:
        return f"{count:,} bytes"
    return f"{size:.3g} {UNITS[unit]}" if size < 1000 else f"{size:,.0f} {UNITS[unit]}"


def overview(rels: list[dict], names: dict[str, str]) -> dict:
    """The total of every memctl table (pg_total_relation_size: heap, TOAST, indexes, maps), in bytes and in
    human units, and its split into groups: episodes, chunks, vectors (every model's table), facts (with
    history), other (jobs, runbook runs, ledgers, ...), largest first."""
    groups: dict[str, dict] = {}
    for rel in rels:
        if rel["kind"] not in ("table", "vectors"):
            continue
        name = names.get(rel["relation"], rel["relation"])
        group = (
            "vectors"
            if rel["kind"] == "vectors"
            else next((label for label, members in GROUPS if name in members), "other")
        )
        entry = groups.setdefault(
            group, {"group": group, "size": "", "total_bytes": 0, "share": 0.0, "tables": 0}
        )
        entry["total_bytes"] += rel["total_bytes"] or 0
        entry["tables"] += 1
    total = sum(g["total_bytes"] for g in groups.values())
    for entry in groups.values():
        entry["size"] = human_bytes(entry["total_bytes"])
        entry["share"] = round(100 * entry["total_bytes"] / total, 1) if total else 0.0
    ordered = sorted(groups.values(), key=lambda g: (-g["total_bytes"], g["group"]))
    return {"total_bytes": total, "total": human_bytes(total), "groups": ordered}


def report(conn: Memory, exact: bool = False) -> dict:
    """The whole size report: relations, models, kinds, agents, growth, and warnings.

    `exact`: count(*) every memctl table whatever its size (TOAST tables are always estimated).
    """
    from memctl.db import cluster

    rels, names = _relations(conn, exact)
    limit = maintenance_work_mem(conn)
    model_rows, warnings = _model_rows(conn, rels, names, limit)
    episodes = next(r for r in rels if r["kind"] == "table" and names[r["relation"]] == "episodes")
    percent = sample_percent(episodes, exact)
    pairs = _pairs(conn, percent)
    return {
        "total": overview(rels, names),
        "relations": rels,
        "models": model_rows,
        "kinds": _rollup(pairs, "kind", percent),
        "agents": _rollup(pairs, "agent", percent),
        "growth": growth(conn, rels, names),
        "nodes": cluster.node_sizes(conn)
        if cluster.citus_version(conn)
        else [],  # Citus: bytes per table and node
        "warnings": warnings,
    }
