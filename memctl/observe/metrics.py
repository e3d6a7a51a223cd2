"""memctl's state as Prometheus metrics (`memctl metrics`), for node_exporter's textfile collector.

Every figure comes from the module that already computes it for an operator: counts, backlog and
warnings from memctl.observe.status (what `memctl status` shows), bytes and growth from
memctl.observe.size's cheap path (what `memctl size` shows, never --exact), the last runs from
memctl.records.jobs. Only the per-kind and per-agent counts are this module's own (groups): a small
block sample past SAMPLE_ROWS episodes, so that nothing here reads a large table whole. The text is produced by prometheus_client (`generate_latest`); a
textfile is written whole (a temporary file beside it, then rename). The figures are gauges: the
job log is pruned ([retention] jobs), so even a count of runs is not monotonic.

Label values that agents choose (agent, kind) are bounded: the top N by episode count keep their
own value, the rest are summed under OTHER (N is [metrics] agents for agents, KINDS_LIMIT for kinds).
docs/metrics.md describes every metric.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator

from prometheus_client.core import CollectorRegistry, GaugeMetricFamily, InfoMetricFamily, Metric

import memctl
from memctl import files
from memctl.config import SCHEMA, Settings, parse_duration
from memctl.errors import BadValue, MemctlError
from memctl.records import jobs

if TYPE_CHECKING:
    from memctl.db.memory import Memory

JOBS = ("embed", "summarize", "prune", "purge", "backup")  # always reported, run or not
OUTCOMES = (
    "running",
    "ok",
    "partial",
    "failed",
    "unavailable",
    "interrupted",
)  # the job log's CHECK constraint
KINDS_LIMIT = 20  # kinds are free text too: the top 20 by episodes keep their own label value
OTHER = "other"
# memctl-summarize.timer runs daily (systemd/memctl-summarize.timer); it has no [schedule] setting.
SUMMARIZE_EVERY = "1d"
# Episodes read for the per-kind and per-agent figures once there are more (see groups): quick at any size,
# and close to the counts (the figures: docs/benchmarks.md).
SAMPLE_ROWS = 5000
TEXTFILE_MODE = 0o644  # node_exporter runs as another user
PREFIX = "memctl"

GROUPS = """
SELECT e.kind, e.agent, count(*) AS episodes,
       coalesce(sum((SELECT count(*) FROM chunks c WHERE c.agent = e.agent AND c.episode_id = e.id)), 0)::bigint
       AS chunks
FROM episodes e {sample} GROUP BY e.kind, e.agent
"""
RUNS = "SELECT job, outcome, count(*) AS n FROM jobs GROUP BY job, outcome"
# Failed or unavailable runs since the last completed one (jobs_job_started_idx): "failing repeatedly".
CONSECUTIVE_FAILURES = """
SELECT count(*) AS n FROM jobs
WHERE job = %(job)s AND outcome = ANY(%(failed)s)
  AND started_at > coalesce((SELECT max(started_at) FROM jobs
                             WHERE job = %(job)s AND outcome = ANY(%(completed)s)), '-infinity')
"""


def _gauge(
    name: str, documentation: str, labels: Iterable[str] = (), unit: str = ""
) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", documentation, labels=list(labels), unit=unit)


def _one(name: str, documentation: str, value: float | None, unit: str = "") -> list[Metric]:
    """A gauge with one unlabelled sample, or nothing when the value is unknown."""
    if value is None:
        return []
    family = _gauge(name, documentation, unit=unit)
    family.add_metric([], float(value))
    return [family]


# --- bounded labels --------------------------------------------------------------------------------


def bounded(rows: list[dict], column: str, limit: int, fields: tuple[str, ...]) -> list[dict]:
    """The `limit` rows with the most episodes, by name; the others summed into one row named OTHER.

    A real value that happens to be named OTHER is merged with the rest (one series, never two).
    """
    ranked = sorted(rows, key=lambda r: (-r["episodes"], str(r[column])))
    kept: dict[str, dict] = {}
    for position, row in enumerate(ranked):
        name = str(row[column]) if position < limit else OTHER
        target = kept.setdefault(name, {column: name, **{f: 0 for f in fields}})
        for f in fields:
            target[f] += row[f] or 0
    return list(kept.values())


# --- the families ------------------------------------------------------------------------------------


def groups(conn: Memory, total: int) -> tuple[list[dict], float]:
    """Episodes and chunks per (kind, agent), and the share of episodes read.

    Up to SAMPLE_ROWS episodes every row is read; past that a block sample (TABLESAMPLE SYSTEM) of
    about SAMPLE_ROWS rows, scaled to `total` (status's exact count). Not size.report's Bernoulli
    sample: that one reads every page of episodes (1M episodes: the sample took longer than all of
    `memctl status`); this one reads about SAMPLE_ROWS / rows-per-page pages.
    """
    from psycopg import sql

    sample: sql.Composable = sql.SQL("")
    if total > SAMPLE_ROWS:
        sample = sql.SQL("TABLESAMPLE SYSTEM ({}) REPEATABLE (0)").format(
            sql.Literal(100.0 * SAMPLE_ROWS / total)
        )
    rows = conn.execute(sql.SQL(GROUPS).format(sample=sample), prepare=False).fetchall()
    read = sum(r["episodes"] for r in rows)
    if total > SAMPLE_ROWS and not read:  # a few pages, none drawn: read them all
        rows = conn.execute(sql.SQL(GROUPS).format(sample=sql.SQL("")), prepare=False).fetchall()
        read = total = sum(r["episodes"] for r in rows)
    if read >= total:
        return rows, 1.0
    scale = total / read
    return [
        {**r, "episodes": round(r["episodes"] * scale), "chunks": round(r["chunks"] * scale)}
        for r in rows
    ], read / total


def _rollup(pairs: list[dict], column: str) -> list[dict]:
    out: dict[str, dict] = {}
    for row in pairs:
        group = out.setdefault(row[column], {column: row[column], "episodes": 0, "chunks": 0})
        group["episodes"] += row["episodes"]
        group["chunks"] += row["chunks"]
    return list(out.values())


def _memory(conn: Memory, total: int) -> list[Metric]:
    """Episodes and chunks by kind and by agent, each bounded (see bounded)."""
    pairs, ratio = groups(conn, total)
    agents_limit = (conn.settings if conn.has_settings else Settings()).metrics.agents
    out: list[Metric] = []
    for column, limit, prefix in (("kind", KINDS_LIMIT, ""), ("agent", agents_limit, "agent_")):
        rows = bounded(_rollup(pairs, column), column, limit, ("episodes", "chunks"))
        for field, what in (("episodes", "Episodes"), ("chunks", "Chunks")):
            family = _gauge(
                f"{prefix}{field}",
                f"{what} per {column} (the {column}s past the top {limit} by "
                f'episodes summed as {column}="{OTHER}")',
                [column],
            )
            for row in rows:
                family.add_metric([row[column]], row[field])
            out.append(family)
    out += _one(
        "groups_sample_ratio",
        "Share of episodes read for the per-kind and per-agent figures: 1 when "
        "every row is counted, else the share of a block sample scaled to the exact total",
        ratio,
    )
    return out


def _backlog(report: dict) -> list[Metric]:
    """The active model's embedding backlog, as `memctl status` reports it."""
    return [
        *_one(
            "embed_pending",
            "Chunks queued for a vector of the active model (memctl status: pending)",
            report["pending"],
        ),
        *_one(
            "embed_failed",
            "Chunks the active model refused, without a vector (memctl status: failed; "
            "memctl embed --retry-failed re-queues them)",
            report["failed"],
        ),
        *_one(
            "embed_orphaned",
            "Chunks with no vector, no queue row and no failure (memctl status: orphaned; "
            "the next memctl embed queues them)",
            report["orphaned"],
        ),
        *_one(
            "embed_oldest_pending_age",
            "Age of the oldest queued chunk when the metrics were taken; 0 when none is queued",
            report["oldest_pending_age_s"] or 0,
            unit="seconds",
        ),
        *_one(
            "status_warnings",
            "Warnings memctl status prints (memctl status --check exits 1 while any stands)",
            len(report["warnings"]),
        ),
    ]


def _models(conn: Memory) -> list[Metric]:
    from memctl.embedding import models

    family = InfoMetricFamily(
        f"{PREFIX}_embedding_model",
        "Each registered embedding model: state active "
        "(searched), backfill (being re-embedded into) or retired (until reembed drop-old)",
        labels=["model_id", "embedder", "model", "dims", "storage", "state"],
    )
    for m in models.all_models(conn):
        family.add_metric([str(m.id), m.embedder, m.model, str(m.dims), m.storage, m.state], {})
    return [family]


def _schedules(settings: Settings | None) -> dict[str, float]:
    """Each timer job's interval, as status reads it ([schedule]; summarize: its daily timer)."""
    from memctl.retention import summarize

    schedule = (settings or Settings()).schedule
    every = {job: parse_duration(getattr(schedule, job)) for job in SCHEMA["schedule"]}
    if settings is not None and summarize.model(settings) is not None:
        every["summarize"] = parse_duration(SUMMARIZE_EVERY)
    return every


def _job_families() -> dict[str, GaugeMetricFamily]:
    label = ["job_name"]
    return {
        "runs": _gauge(
            "job_runs",
            "Runs in the job log by outcome (memctl jobs; the log is trimmed by prune, "
            "so this can fall)",
            ["job_name", "outcome"],
        ),
        "outcome": _gauge(
            "job_last_outcome",
            "1 for the outcome of the job's last run, 0 for the others",
            ["job_name", "outcome"],
        ),
        "success": _gauge(
            "job_last_success_timestamp",
            "When the job's last completed run (ok or partial) finished",
            label,
            unit="seconds",
        ),
        "started": _gauge(
            "job_last_run_timestamp", "When the job's last run started", label, unit="seconds"
        ),
        "duration": _gauge(
            "job_last_duration",
            "How long the job's last finished run took (an idle streak of memctl embed counts 0)",
            label,
            unit="seconds",
        ),
        "rows": _gauge(
            "job_last_rows",
            "Rows the job's last run handled (chunks embedded, episodes deleted...)",
            label,
        ),
        "failures": _gauge(
            "job_consecutive_failures",
            "Failed or unavailable runs since the job's last completed run",
            label,
        ),
        "schedule": _gauge(
            "job_schedule",
            "How often the job's timer runs ([schedule]; memctl status warns past twice this)",
            label,
            unit="seconds",
        ),
    }


def _jobs(conn: Memory) -> list[Metric]:
    settings = conn.settings if conn.has_settings else None
    from memctl.observe import status

    runs: dict[str, dict[str, int]] = {job: dict.fromkeys(OUTCOMES, 0) for job in JOBS}
    for row in conn.execute(RUNS).fetchall():
        runs.setdefault(row["job"], dict.fromkeys(OUTCOMES, 0))[row["outcome"]] = row["n"]
    families = _job_families()
    for job, counts in sorted(runs.items()):
        for outcome, n in counts.items():
            families["runs"].add_metric([job, outcome], n)
        _last_run(conn, job, families)
        failures = conn.one(
            CONSECUTIVE_FAILURES,
            {"job": job, "failed": list(status.FAILED_OUTCOMES), "completed": list(jobs.COMPLETED)},
        )["n"]
        families["failures"].add_metric([job], failures)
    for job, seconds in sorted(_schedules(settings).items()):
        families["schedule"].add_metric([job], seconds)
    return list(families.values())


def _last_run(conn: Memory, job: str, families: dict[str, GaugeMetricFamily]) -> None:
    last = next(iter(jobs.list_jobs(conn, job=job, limit=1)), None)
    if last is None:
        if (
            job in JOBS
        ):  # never run: late from the memory's creation, so MemctlJobLate fires for a timer never run
            families["success"].add_metric([job], jobs.memory_created(conn)["at"].timestamp())
        return
    for outcome in OUTCOMES:
        families["outcome"].add_metric([job, outcome], 1 if last["outcome"] == outcome else 0)
    families["started"].add_metric([job], last["started_at"].timestamp())
    families["rows"].add_metric([job], last["rows"])
    if last["finished_at"] is not None:
        idle = "idle_passes" in (
            last["detail"] or {}
        )  # one row for a streak of idle passes (embedding.worker)
        duration = 0.0 if idle else (last["finished_at"] - last["started_at"]).total_seconds()
        families["duration"].add_metric([job], duration)
    completed = jobs.last_completed(conn, job)
    if completed is not None:
        families["success"].add_metric([job], completed["finished_at"].timestamp())
    elif job in JOBS:  # runs, none completed: late from the memory's creation too
        families["success"].add_metric([job], jobs.memory_created(conn)["at"].timestamp())


def _database(conn: Memory, sizes: dict, data_dir: Path | None) -> list[Metric]:
    """Bytes by relation group, from `memctl size`'s relations (heap, TOAST and maps as data; indexes apart)."""
    from memctl.embedding import models

    by_table = {m.table_name: m for m in models.all_models(conn)}
    family = _gauge(
        "database",
        "Bytes of memctl's tables by group (episodes, chunks, vectors of each model, other) "
        "and part (data: heap, TOAST and maps; indexes), as memctl size reports them",
        unit="bytes",
    )
    totals: dict[tuple, int] = {}
    for rel in sizes["relations"]:
        if rel["kind"] not in ("table", "vectors"):
            continue  # TOAST and index rows are inside their table's total_bytes
        name = rel["relation"].rsplit(".", 1)[-1].strip('"')
        model = by_table.get(name)
        group = (
            "vectors" if model is not None else name if name in ("episodes", "chunks") else "other"
        )
        ids = (
            (("model_id", str(model.id)), ("model", f"{model.embedder}:{model.model}"))
            if model
            else ()
        )
        for part, size in (
            ("data", rel["total_bytes"] - rel["index_bytes"]),
            ("indexes", rel["index_bytes"]),
        ):
            key = (("group", group), ("part", part), *ids)
            totals[key] = totals.get(key, 0) + size
    for key, size in sorted(totals.items()):
        family.add_sample(family.name, dict(key), size)  # only the vectors carry model labels
    growth = sizes["growth"]
    out = [
        family,
        *_one(
            "database_growth_bytes_per_day",
            "Episodes per day over 30 days times bytes per episode (memctl size --section growth)",
            growth["rows_per_day_30d"] * growth["bytes_per_episode"],
        ),
    ]
    if data_dir is not None and data_dir.is_dir():
        fs = os.statvfs(data_dir)
        out += _one(
            "filesystem_avail",
            "Bytes available to unprivileged users on the filesystem of the embedded "
            "server's data directory",
            fs.f_bavail * fs.f_frsize,
            unit="bytes",
        )
        out += _one(
            "filesystem_size",
            "Size of the filesystem of the embedded server's data directory",
            fs.f_blocks * fs.f_frsize,
            unit="bytes",
        )
    return out


def overdue_episodes(conn: Memory) -> int | None:
    """Episodes past summarize.overdue's limit with no summary; None when summaries are off."""
    settings = conn.settings if conn.has_settings else None
    from memctl.retention import summarize

    if settings is None or summarize.model(settings) is None or not summarize.kinds(settings):
        return None
    late = (
        parse_duration(settings.summarize.after) + 86400 + summarize.OVERDUE_GRACE_S
    )  # as overdue()
    return conn.one(summarize.OVERDUE, (summarize.kinds(settings), late))["n"]


def _info(conn: Memory) -> list[Metric]:
    from memctl.db import migrate, preflight

    applied = [m.name for m in migrate.plan(conn) if m.status == "applied"]
    pgvector = preflight.pgvector_version(conn)
    family = InfoMetricFamily(
        f"{PREFIX}",
        "memctl's version, its schema (the last migration applied) and the "
        "server's PostgreSQL and pgvector versions",
        labels=["version", "schema", "postgresql", "pgvector"],
    )
    family.add_metric(
        [
            memctl.__version__,
            applied[-1].removesuffix(".sql") if applied else "",
            preflight.server_version(conn)[1],
            ".".join(map(str, pgvector)) if pgvector else "",
        ],
        {},
    )
    return [family]


def size_figures(conn: Memory) -> dict:
    """`memctl size`'s relations and growth, on its cheap path (never --exact)."""
    from memctl.observe import size

    rels = size.relations(conn)
    names = {r["relation"]: r["relation"].rsplit(".", 1)[-1].strip('"') for r in rels}
    return {"relations": rels, "growth": size.growth(conn, rels, names)}


def collect(conn: Memory, *, data_dir: Path | None = None) -> list[Metric]:
    """Every metric family, from one connection. `data_dir`: the embedded server's data directory, if any."""
    settings = conn.settings if conn.has_settings else None
    from memctl.observe import status

    started = time.monotonic()
    report = status.collect(conn)
    sizes = size_figures(conn)
    families = [
        *_info(conn),
        *_memory(conn, report["episodes"]),
        *_backlog(report),
        *_models(conn),
        *_jobs(conn),
        *_database(conn, sizes, data_dir),
    ]
    families += _one(
        "summaries_overdue_episodes",
        "Episodes older than [summarize] after plus two days with no "
        "summary (absent when summaries are off)",
        overdue_episodes(conn),
    )
    families += _agents_without_role(conn)
    return [*families, *_up(1, started)]


def _agents_without_role(conn: Memory) -> list[Metric]:
    from memctl.db import wall

    return _one(
        "agents_without_role",
        "Registered agents whose PostgreSQL role is missing or not usable on this "
        "server (their calls fail: `memctl status` names them)",
        len(wall.broken(conn)),
    )


def _up(value: int, started: float) -> list[Metric]:
    return [
        *_one("up", "1 when memctl metrics read the database, 0 when it could not", value),
        *_one("metrics_timestamp", "When these metrics were taken", time.time(), unit="seconds"),
        *_one(
            "metrics_duration",
            "How long taking them took",
            time.monotonic() - started,
            unit="seconds",
        ),
    ]


def unavailable() -> list[Metric]:
    """What a textfile says when the database cannot be read: memctl_up 0 and the version."""
    family = InfoMetricFamily(
        f"{PREFIX}", "memctl's version (the database could not be read)", labels=["version"]
    )
    family.add_metric([memctl.__version__], {})
    return [family, *_up(0, time.monotonic())]


# --- output ---------------------------------------------------------------------------------------------


class _Snapshot:
    """A collector that yields families already taken (prometheus_client's custom-collector protocol)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def registry(families: list[Metric]) -> CollectorRegistry:
    found = CollectorRegistry(auto_describe=False)
    found.register(_Snapshot(families))
    return found


def text(families: list[Metric]) -> bytes:
    """The Prometheus text exposition format."""
    from prometheus_client import generate_latest

    return generate_latest(registry(families))


def check_textfile(path: str) -> Path:
    """The textfile's path, refused (exit 2) unless node_exporter's collector would read it."""
    target = Path(path)
    if target.suffix != ".prom":
        raise BadValue(
            f"--textfile {path!r}: node_exporter's textfile collector reads only files ending in .prom",
            "--textfile",
        )
    files.regular_target(target, "--textfile")
    if not target.parent.is_dir():
        raise MemctlError(
            f"--textfile {path!r}: no directory {str(target.parent)!r} (create it, and point "
            "node_exporter's --collector.textfile.directory at it)"
        )
    return target


def write_textfile(path: Path, families: list[Metric]) -> None:
    """Write atomically: a temporary file in the same directory, then rename (never a half-written file).

    prometheus_client's write_to_textfile does the same but leaves the mode to the umask, and the units
    run with UMask=0077: node_exporter's user could not read the file. The metrics hold counts and
    names (agents, kinds, models), never memory text: the file is 0644 whatever the umask.
    """
    data = text(families)
    try:  # the temporary file is .NAME.*.tmp, not *.prom: the collector skips it
        with files.atomic_write(path, mode=TEXTFILE_MODE, text=False) as handle:
            handle.write(data)
    except OSError as exc:
        raise MemctlError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None


def rules_path() -> Path:
    """The alert rules shipped with memctl: inside the installed package, or the checkout's prometheus/."""
    packaged = Path(memctl.__file__).parent / "prometheus_rules"
    folder = packaged if packaged.is_dir() else Path(memctl.__file__).parent.parent / "prometheus"
    return folder / "memctl.rules.yml"


def rules_text() -> str:
    path = rules_path()
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise MemctlError(
            f"the alert rules shipped with memctl are missing ({path}: {exc.strerror}): "
            "reinstall memctl"
        ) from None
