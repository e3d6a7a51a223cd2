"""The ops corpus of the cluster tests (tests/test_cluster.py) and of tests/bench/cluster.py: the 30 labelled
episodes of tests/data/retrieval.json and routine operations filler across six agents."""

from __future__ import annotations

import json
from pathlib import Path

DATA = json.loads((Path(__file__).parent / "data" / "retrieval.json").read_text())
# Six agents, three on each worker (hash of agent -> one of citus.shard_count's 32 shards, placed on the two
# workers in turn): with a handful of agents the hash alone can put every one on the same node.
AGENTS = ("ops", "mail", "web", "auth", "db", "edge")
LABELLED_AGENT = "ops"
CORPUS_ROWS = 3010
OLD_RAW = 300  # kind raw, 40-50 days old: what a 30-day raw policy prunes
PURGED = 40  # written by the source purged in step 4
PURGED_SOURCE = "ticket:spam-import"
SERVICES = (
    "billing-api",
    "auth",
    "search-indexer",
    "mailer",
    "thumbnailer",
    "gateway",
    "scheduler",
    "exporter",
)
HOSTS = ("app1", "app2", "app3", "batch1", "edge1", "edge2", "mon1")


def ops_filler(rng, n: int) -> str:
    """One routine operations log line: telemetry and chores, sharing no content word with the ten questions."""
    svc, host, other = rng.choice(SERVICES), rng.choice(HOSTS), rng.choice(SERVICES)
    return (
        rng.choice(
            [
                f"{svc} health check on {host} answered in {rng.randint(3, 90)} ms",
                f"Scaled {svc} from {rng.randint(2, 4)} to {rng.randint(5, 9)} replicas ahead of the batch window",
                f"Scheduled {svc} export finished in {rng.randint(2, 40)} minutes with {rng.randint(1000, 99999)} rows",
                f"Deployed {svc} 1.{rng.randint(0, 30)}.{rng.randint(0, 9)} to {host}; smoke tests passed",
                f"Ticket OPS-{rng.randint(1000, 9999)}: renamed a panel of the {svc} dashboard",
                f"Upgraded the {svc} base image on {host}; {rng.randint(2, 30)} packages updated",
                f"{host} CPU at {rng.randint(60, 95)}% for {rng.randint(2, 15)} minutes while {svc} reindexed; no action",
                f"Moved {svc} metrics scraping for {other} to a {rng.randint(10, 60)} s interval",
                f"Feature flag {svc}.beta-{rng.randint(1, 40)} enabled for {rng.randint(1, 50)}% of traffic",
            ]
        )
        + f" (entry {n})"
    )


def ops_corpus(size: int = CORPUS_ROWS) -> list[dict]:
    """The 30 labelled episodes (agent ops, recent) and routine filler across six agents: 3,010 rows."""
    import datetime
    import random

    rng = random.Random(14)
    now = datetime.datetime.now(datetime.timezone.utc)
    rows = [
        {
            "content": text,
            "agent": LABELLED_AGENT,
            "kind": "note",
            "created_at": (now - datetime.timedelta(days=1 + i % 10)).isoformat(),
        }
        for i, text in enumerate(DATA["episodes"])
    ]
    for n in range(size - len(rows)):
        row = {
            "content": ops_filler(rng, n),
            "agent": AGENTS[n % len(AGENTS)],
            "kind": "note",
            "created_at": (now - datetime.timedelta(days=rng.uniform(0, 20))).isoformat(),
        }
        if n < OLD_RAW:
            row.update(
                kind="raw", created_at=(now - datetime.timedelta(days=40 + n % 10)).isoformat()
            )
        elif n < OLD_RAW + PURGED:
            row["source"] = PURGED_SOURCE
        rows.append(row)
    return rows
