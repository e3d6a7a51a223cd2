"""Skips in CI: which skips each step of the README's Tests block expects, declared once, and the hooks that fail
any other (docs/testing.md "Skips in CI"). Loaded through pytest_plugins (tests/conftest.py).

`.ci/run` exports CI=1. With CI set, the step is recognised from the environment the block gives it, and a skip
whose reason matches none of that step's patterns fails, giving its reason: a test that cannot run where CI runs
it is a failure CI must show, not a line in a summary. A module skipped whole at collection fails the collection.
Outside CI every skip stays a skip.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest


@dataclass(frozen=True)
class Step:
    number: int
    name: str
    expected: tuple[str, ...]  # regular expressions, each searched for in a skip's reason
    met: dict[str, int] = field(default_factory=dict, compare=False)  # reason: skips of it this run

    def expects(self, reason: str) -> bool:
        return any(re.search(pattern, reason) for pattern in self.expected)


# Each pattern is the start of a skip's reason as the test gives it; the comment ends with the skips the step showed.
CITUS = r"^needs a Citus cluster: set MEMCTL_TEST_CITUS_URL"  # test_cluster.py without step 4's cluster: 15
NUMPY = r"^needs memctl\[local\] \(numpy\)"  # test_minilm.py, collected before -m 'not local' deselects it: 1
WALL = r"^a superuser's session may undo SET SESSION AUTHORIZATION"  # test_agents_wall.py, one login of the matrix: 1

STEPS = (
    Step(
        1,
        "production profile: .venv-ollama, -m 'not local'",
        (
            CITUS,
            NUMPY,
            WALL,
            r"^the test server is as new as the embedded PostgreSQL 18",  # test_backup.py, for step 3's PG 15: 1
            r"^moves a memory from an older PostgreSQL major",  # test_upgrade_major.py, for step 3's PG 15: 2
            r"^the test role is a superuser, which has every privilege",  # test_production.py, for step 3's role: 1
        ),
    ),
    Step(2, "the local embedder: .venv, -m local", ()),
    Step(
        3,
        "Debian's PostgreSQL 15, unprivileged role: MEMCTL_TEST_DATABASE_URL, MEMCTL_TEST_SERVER_ONLY",
        (
            NUMPY,
            WALL,
            r"^SET SESSION AUTHORIZATION needs a superuser",  # fix_agents.py: the agents' matrix, step 1 runs it: 30
            r"^needs a (database )?superuser\b",  # test_erasure.py, test_own_role.py, test_upgrade_migrate.py: 3
            r"^a standby is made with pg_basebackup of the tests' embedded server",  # test_replica.py: 4
        ),
    ),
    Step(4, "the cluster tests: MEMCTL_TEST_CITUS_URL, tests/test_cluster.py", ()),
)


def step_of(environ: Mapping[str, str]) -> Step | None:
    """The CI step a run is, from its environment; None outside CI (CI unset or empty)."""
    if not environ.get("CI"):
        return None
    if environ.get("MEMCTL_TEST_CITUS_URL"):
        return STEPS[3]
    if environ.get("MEMCTL_TEST_DATABASE_URL"):
        return STEPS[2]
    if environ.get("MEMCTL_TEST_PROFILE") == "production":
        return STEPS[0]
    return STEPS[1]


STEP = step_of(os.environ)


def judge(report, step: Step | None) -> None:
    """A skip STEP does not expect becomes a failure giving its reason; an expected one is counted."""
    if step is None or not report.skipped or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    reason = (longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)).removeprefix(
        "Skipped: "
    )
    if step.expects(reason):
        step.met[reason] = step.met.get(reason, 0) + 1
        return
    report.outcome = "failed"
    report.longrepr = (
        f"skipped in CI step {step.number} ({step.name}), which does not expect this skip "
        f"(tests/fix_ci.py): {reason}"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    judge(report, STEP)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    judge(report, STEP)
    return report


def pytest_terminal_summary(terminalreporter):
    """Under CI, each expected skip's pattern and how many skips met it (0: the declaration may be stale)."""
    if STEP is None:
        return
    terminalreporter.section(f"CI step {STEP.number}: {STEP.name}")
    for pattern in STEP.expected:
        met = sum(n for reason, n in STEP.met.items() if re.search(pattern, reason))
        terminalreporter.line(f"{met:5} skipped as expected: {pattern}")
    if not STEP.expected:
        terminalreporter.line("no skip expected, none met")
