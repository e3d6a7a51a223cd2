"""Linearity without a clock: count the Python steps a call takes, at size n and at 10n (docs/testing.md).

A step is a `call` or `line` event of sys.settrace in any Python frame the call runs, memctl's and the standard
library's alike; the count is the same on a busy machine as on an idle one. A parser that rescans its input
(a loop inside a loop, a walk back over what it read) takes about 100 times the steps at 10 times the size, and
`linear` fails it, stopping a run once it is over its budget so that a quadratic parser fails in a moment.
A step inside one C call (a regular expression's backtracking, a `str.find` from the start) is one step
whatever it costs: what runs in C is bounded by its construction (anchored patterns, no nested repetition).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

FACTOR = 10  # the larger input is this many times the smaller
RATIO = (
    12  # steps at FACTOR n over steps at n: linear is about FACTOR, quadratic about FACTOR squared
)


class OverBudget(BaseException):
    """Raised inside the traced call when its steps pass the budget (a BaseException: no `except Exception` in the
    code under test swallows it)."""


def steps(call: Callable[[], Any], budget: int | None = None) -> tuple[int, Any]:
    """(steps taken, what `call()` returned or the Exception it raised); OverBudget past `budget` steps."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        count += 1
        if budget is not None and count > budget:
            raise OverBudget(f"over {budget:,} steps")
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        outcome = call()
    except Exception as exc:  # the call's own refusal is its outcome: the caller asserts on it
        outcome = exc
    finally:
        sys.settrace(previous)
    return count, outcome


def linear(
    parse: Callable[[Any], Any], make: Callable[[int], Any], n: int, per_unit: int = 200
) -> tuple[Any, Any]:
    """parse(make(n)) and parse(make(FACTOR * n)) (each input made before its count starts): (both outcomes).
    The first may take `per_unit` steps for each unit of n, the second RATIO times what the first took; past its
    budget a run is stopped and the test fails, saying the counts."""
    small_input, large_input = make(n), make(FACTOR * n)
    try:
        small, small_outcome = steps(lambda: parse(small_input), budget=per_unit * n)
    except OverBudget:
        raise AssertionError(
            f"over {per_unit} steps per unit at n = {n:,}: not linear, or n is too large"
        ) from None
    try:
        large, large_outcome = steps(lambda: parse(large_input), budget=RATIO * small)
    except OverBudget:
        raise AssertionError(
            f"{small:,} steps at n = {n:,}, over {RATIO * small:,} at {FACTOR}n: not linear"
        ) from None
    return small_outcome, large_outcome
