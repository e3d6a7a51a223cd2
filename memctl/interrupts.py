"""SIGINT and SIGTERM: how every long command stops when told (README's exit codes, docs/systemd.md).

One handler for both signals, installed once, by the command line's entry point (`install`). A signal raises
`Interrupted`, a KeyboardInterrupt: psycopg cancels the statement in flight on one (its wait functions wake
every 0.1 s to let a handler run), the transaction in progress rolls back, a job row ends 'interrupted'
(memctl.records.jobs), a client program (pg_dump) is killed, and the command exits 128 + the signal's number:
130 for SIGINT, 143 for SIGTERM. What a command had committed before stays, whole.

A loop that must finish the unit in hand (ingest stores the lines it took from a pipe; embed commits the batch
in flight) runs it inside `deferred()`: there a signal is only noted, the loop asks `requested()` between
units and stops, and the command then raises it with `check()`. A second signal raises at once, there too.
Any signal that comes while an Interrupted is already unwinding (the rollback, the job row) ends the process
at once with its exit code: a second Ctrl-C never waits for a server that does not answer.

The handler is installed whatever the process inherited: a background job of a non-interactive shell
starts with SIGINT ignored, and `kill -INT` must stop it as Ctrl-C stops it in a terminal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A command stopped by SIGINT or SIGTERM: exit 128 + its number."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(self.name)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _State:
    def __init__(self) -> None:
        self.requested: int | None = None  # the first signal, while deferred
        self.raised = False  # an Interrupted is unwinding
        self.deferring = 0
        self.installed = False
        self.event = threading.Event()


_STATE = _State()


def install() -> None:
    """The handler for SIGINT and SIGTERM, from the main thread (the CLI's entry point calls it once)."""
    for sig in SIGNALS:
        signal.signal(sig, _handle)
    _STATE.installed = True


def done() -> None:
    """The command's work is over (what is left is writing out and exiting): a signal from now on ends the
    process as the signal itself does (exit 130, 143 to the shell), with nothing left to stop."""
    if _STATE.installed:
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_DFL)


def _handle(signum: int, frame) -> None:
    state = _STATE
    if state.raised:
        os._exit(128 + signum)
    if state.deferring and state.requested is None:
        state.requested = signum
        state.event.set()
        return
    state.raised = True
    raise Interrupted(signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A signal inside is noted, not raised (a second one is): the loop stops between whole units."""
    _STATE.deferring += 1
    try:
        yield
    finally:
        _STATE.deferring -= 1


def requested() -> str | None:
    """The name of the signal asked to stop (SIGTERM), or None."""
    signum = _STATE.requested
    return None if signum is None else signal.Signals(signum).name


def wait(seconds: float) -> bool:
    """Sleep up to SECONDS; True at once when a stop was requested."""
    return _STATE.event.wait(seconds)


def check() -> None:
    """Raise the signal a deferred section noted (after its loop stopped between units)."""
    signum = _STATE.requested
    if signum is not None:
        _STATE.raised = True
        raise Interrupted(signum)
