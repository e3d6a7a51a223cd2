"""Hypothesis profiles for tests/test_fuzz.py.

ci    derandomized and bounded: the same examples on every run, the whole file in well under two
      minutes on 2 cores (the Tests block runs it).
long  random, MEMCTL_FUZZ_EXAMPLES examples per in-process property (tests/bench/fuzz.py sets it);
      the properties that run the CLI against the database take a fixed share of that.

MEMCTL_FUZZ_PROFILE picks the profile (default ci). No example database: a failure is reported
with its minimal example and the blob to reproduce it (@reproduce_failure).

Shrinking a failure of a property that runs the CLI costs a database connection per attempt, and
Hypothesis shrinks for up to 300 s per failure: the ci profile stops after SHRINK_SECONDS (a
module global of Hypothesis's engine, set here if it still exists), so a run with failures stays
bounded too. MEMCTL_FUZZ_SHRINK_SECONDS sets it for either profile.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

CI_EXAMPLES = 100
# The database is made once per test and checked before and after each example: Hypothesis must
# not refuse a function-scoped fixture, nor a slow or large example (a CLI run costs a connection).
SUPPRESSED = [
    HealthCheck.function_scoped_fixture,
    HealthCheck.too_slow,
    HealthCheck.data_too_large,
    HealthCheck.filter_too_much,
    HealthCheck.large_base_example,
]
COMMON = {
    "deadline": None,
    "database": None,
    "suppress_health_check": SUPPRESSED,
    "print_blob": True,
}

settings.register_profile("ci", derandomize=True, max_examples=CI_EXAMPLES, **COMMON)
settings.register_profile(
    "long",
    derandomize=False,
    max_examples=int(os.environ.get("MEMCTL_FUZZ_EXAMPLES", "2000")),
    **COMMON,
)
PROFILE = os.environ.get("MEMCTL_FUZZ_PROFILE", "ci")
settings.load_profile(PROFILE)
SHRINK_SECONDS = int(
    os.environ.get("MEMCTL_FUZZ_SHRINK_SECONDS", "8" if PROFILE == "ci" else "120")
)


def _bound_shrinking() -> None:
    from hypothesis.internal.conjecture import engine

    if hasattr(engine, "MAX_SHRINKING_SECONDS"):
        engine.MAX_SHRINKING_SECONDS = SHRINK_SECONDS


_bound_shrinking()


def share(fraction: float) -> settings:
    """Settings for a slower property: this fraction of the profile's examples, at least 5."""
    return settings(max_examples=max(5, int(settings.default.max_examples * fraction)))
