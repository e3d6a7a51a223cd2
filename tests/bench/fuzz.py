"""The long fuzz profile: every property of tests/test_fuzz.py with many random examples.

Runs tests/test_fuzz.py under pytest with the `long` profile (tests/fuzz_profiles.py): random
(not derandomized), --examples examples per in-process property, the properties that run the CLI
against the database a fixed share of that. Prints, per property, how many examples ran, its
outcome and time, then each failure: the exception and the minimal example Hypothesis shrank it
to (with the @reproduce_failure blob). The seed is printed too: --seed replays the same run.

    python tests/bench/fuzz.py [--examples 2000] [--seed N] [--shrink-seconds 120] [-k EXPR]
                               [--database-url URL]

Exit status: 0 when every property held, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class Report:
    """Collects each test's outcome, time and failure text, and the examples run per property."""

    def __init__(self) -> None:
        self.rows: dict[str, dict] = {}
        self.runs: dict[str, int] = {}

    def pytest_runtest_logreport(self, report) -> None:
        row = self.rows.setdefault(
            report.nodeid, {"outcome": "passed", "seconds": 0.0, "failure": ""}
        )
        row["seconds"] += report.duration
        if report.failed:
            row["outcome"] = "failed" if report.when == "call" else f"error in {report.when}"
            row["failure"] = report.longreprtext
        elif report.skipped and report.when != "teardown":
            row["outcome"] = "skipped"

    def pytest_sessionfinish(self, session) -> None:
        for item in session.items:
            runs = getattr(getattr(item, "module", None), "RUNS", None)
            if runs is not None:
                self.runs = dict(runs)
                return


def summary(text: str, limit: int = 40) -> str:
    """The exception and the failing example (pytest's E lines, nested values and fixtures' contents left out)."""
    kept = []
    for line in text.splitlines():
        body = line[4:] if line.startswith("E   ") else None
        if body is None or "These lines were" in body or "/site-packages/" in body:
            continue
        if len(body) - len(body.lstrip()) <= 4 or "reproduce_failure" in body:
            kept.append(line if len(line) <= 200 else line[:197] + "...")
    if len(kept) > limit:
        kept = kept[:limit] + [f"E   ... {len(kept) - limit} more lines"]
    return "\n".join(kept) or text[-2000:]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=2000, help="examples per in-process property")
    p.add_argument(
        "--seed", type=int, default=None, help="Hypothesis seed (default: a random one, printed)"
    )
    p.add_argument("--shrink-seconds", type=int, default=120, help="time to shrink each failure")
    p.add_argument("-k", dest="keyword", default=None, help="only the properties pytest -k selects")
    p.add_argument(
        "--database-url",
        default=os.environ.get("MEMCTL_TEST_DATABASE_URL"),
        help="admin URL of a server to use (default: a temporary embedded server)",
    )
    args = p.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    os.environ.update(
        MEMCTL_FUZZ_PROFILE="long",
        MEMCTL_FUZZ_EXAMPLES=str(args.examples),
        MEMCTL_FUZZ_SHRINK_SECONDS=str(args.shrink_seconds),
    )
    if args.database_url:
        os.environ["MEMCTL_TEST_DATABASE_URL"] = args.database_url
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    import pytest

    report = Report()
    argv = [
        "-q",
        "-p",
        "no:cacheprovider",
        "--tb=short",
        f"--hypothesis-seed={seed}",
        "tests/test_fuzz.py",
    ]
    if args.keyword:
        argv += ["-k", args.keyword]
    print(f"fuzz: --examples {args.examples} per in-process property, seed {seed}", flush=True)
    started = time.perf_counter()
    code = pytest.main(argv, plugins=[report])
    elapsed = time.perf_counter() - started

    print(f"\n{'property':<52} {'examples':>8} {'seconds':>8}  outcome")
    for nodeid, row in report.rows.items():
        name = nodeid.split("::", 1)[-1]
        examples = report.runs.get(name.split("[", 1)[0], "-")
        print(f"{name[:52]:<52} {examples!s:>8} {row['seconds']:>8.1f}  {row['outcome']}")
    failures = {n: r for n, r in report.rows.items() if r["failure"]}
    print(
        f"\n{sum(report.runs.values())} examples in {elapsed:.0f} s; {len(failures)} of {len(report.rows)} "
        f"tests failed (seed {seed})"
    )
    for nodeid, row in failures.items():
        print(f"\n=== {nodeid}\n{summary(row['failure'])}")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
