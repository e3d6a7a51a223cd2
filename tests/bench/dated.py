"""Questions that name a day, on an operations log where the same events recur every day.

"why did the api deploy fail on 2026-05-12?" asked of a memory that holds a deploy failure on most
days: the words and the meaning match hundreds of episodes, and only the date tells them apart.
The time term of scoring (docs/search.md, "Dates in a query") reorders the candidates that the two
halves found; this measures whether the episode of the named day is among them.

The log: DAYS days of EVENTS_PER_DAY episodes each (one agent, kind observation), drawn from
operations templates with varying hosts, services and numbers, seeded; on most days a deploy of one
of the services fails for one of the reasons, so a day's failure is told in the same words as many
others. Each question asks why a service's deploy failed on a day that had one, naming the day in one
of the forms people write ("on 2026-05-12", "on 12 May 2026", "on May 12, 2026"); its answer is that
day's failure. Loaded through the CLI (`memctl episode import`, `memctl embed` with the local
all-minilm), then asked as one `memctl episode search --batch --no-track` per [search] setting
(defaults, then each --variant, e.g. "when_weight=0"). Prints recall@1 and @10 and the batch's time.

    python tests/bench/dated.py [--days 400] [--questions 200] [--variant when_weight=0]
"""

from __future__ import annotations

import datetime
import json
import os
import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import retrieval
from _common import fresh_database, parser, server

SERVICES = ("api", "billing", "search", "checkout", "auth", "reports")
REASONS = (
    "migration lock timeout on the orders table",
    "health check never passed on the canary pods",
    "image pull backoff from the private registry",
    "config map missing the new feature flag",
    "database connection pool exhausted during warmup",
    "disk full on the build runner",
    "TLS certificate expired on the internal load balancer",
    "out of memory in the JVM at startup",
    "schema drift between staging and production",
    "rate limited by the package mirror",
)
ROUTINE = (
    "disk {n}% on web-{h}",
    "nginx restarted on web-{h} after config reload",
    "nightly backup of the {s} database completed in {n} minutes",
    "certificate renewal ok for {s}",
    "replica lag {n}s on db-{h}",
    "queue backlog of {n}00 jobs for {s} workers",
    "{s} latency p99 {n}0 ms",
    "autoscaler added {h} nodes to the {s} pool",
    "cron job cleanup-{s} finished",
    "redis eviction rate {n} per second on cache-{h}",
)
FORMS = ("on {d:%Y-%m-%d}", "on {d.day} {d:%B %Y}", "on {d:%B} {d.day}, {d.year}")
END = datetime.datetime(
    2026, 11, 30, tzinfo=datetime.timezone.utc
)  # the log's last day (not in the future)


def log(days: int, per_day: int, seed: int = 7) -> tuple[list[dict], list[tuple[str, str]]]:
    """The episodes, and (question, the content of its answer) for every day with a deploy failure."""
    rng = random.Random(seed)
    rows, failures = [], []
    for day in range(days):
        date = END - datetime.timedelta(days=days - 1 - day)
        fails = rng.random() < 0.8
        slots = sorted(rng.sample(range(24 * 60), per_day))
        for i, minute in enumerate(slots):
            when = date + datetime.timedelta(minutes=minute)
            if fails and i == per_day // 2:
                service, reason = rng.choice(SERVICES), rng.choice(REASONS)
                text = f"the {service} deploy failed: {reason}"
                failures.append((date, service, text))
            else:
                text = rng.choice(ROUTINE).format(
                    n=rng.randint(1, 99), h=rng.randint(1, 9), s=rng.choice(SERVICES)
                )
            rows.append(
                {
                    "content": text,
                    "kind": "observation",
                    "agent": "ops",
                    "created_at": when.isoformat(),
                }
            )
    questions = [
        (f"why did the {service} deploy fail {rng.choice(FORMS).format(d=date)}?", text)
        for date, service, text in failures
    ]
    return rows, questions


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--days", type=int, default=400)
    p.add_argument("--per-day", type=int, default=15)
    p.add_argument(
        "--questions",
        type=int,
        default=200,
        help="how many of the days with a failure to ask about",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        help="[search] settings for another run on the same data, e.g. 'when_weight=0' (repeatable)",
    )
    p.add_argument("--embedder", choices=("local", "hash"), default="local")
    args = p.parse_args()
    rows, questions = log(args.days, args.per_day)
    questions = random.Random(1).sample(questions, min(args.questions, len(questions)))
    memctl = retrieval.memctl_command(None)
    scratch = Path(tempfile.mkdtemp(prefix="memctl-dated-"))
    try:
        with server(args.database_url) as admin, fresh_database(admin) as url:
            env = {
                **os.environ,
                "MEMCTL_DATABASE_URL": url,
                "MEMCTL_EMBEDDER": args.embedder,
                "MEMCTL_EMBED_MODEL": "all-minilm" if args.embedder == "local" else "hash",
                "MEMCTL_CONFIG": str(scratch / "memctl.toml"),
                "HF_HUB_OFFLINE": "1",
            }
            retrieval.write_config(scratch / "memctl.toml", "")
            (scratch / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            started = time.perf_counter()
            for step in (["episode", "import", str(scratch / "log.jsonl")], ["embed"]):
                subprocess.run(memctl + step, env=env, check=True, stdout=subprocess.DEVNULL)
            print(
                f"{len(rows)} episodes over {args.days} days, {len(questions)} questions; loaded and embedded "
                f"({args.embedder}) in {time.perf_counter() - started:.0f} s"
            )
            batch = "".join(
                json.dumps({"query": q, "agent": "ops", "k": 10}) + "\n" for q, _ in questions
            )
            for variant in [""] + args.variant:
                retrieval.write_config(scratch / "memctl.toml", variant)
                started = time.perf_counter()
                done = subprocess.run(
                    memctl
                    + ["episode", "search", "--batch", "-", "--format", "jsonl", "--no-track"],
                    input=batch,
                    text=True,
                    capture_output=True,
                    env=env,
                    check=True,
                )
                elapsed = time.perf_counter() - started
                answers = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
                ranks = [
                    next(
                        (
                            i
                            for i, h in enumerate(a["results"])
                            if h["content"] == text and h["created_at"][:10] == _day(q)
                        ),
                        None,
                    )
                    for (q, text), a in zip(questions, answers)
                ]
                at = {k: sum(r is not None and r < k for r in ranks) / len(ranks) for k in (1, 10)}
                print(
                    f"[{variant or 'defaults'}] recall@1 {at[1]:.3f}, recall@10 {at[10]:.3f}; "
                    f"batch {elapsed:.1f} s ({1000 * elapsed / len(questions):.1f} ms a question)"
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _day(question: str) -> str:
    from memctl.reading.when import period

    found = period(question)
    return found.start.date().isoformat()


if __name__ == "__main__":
    main()
