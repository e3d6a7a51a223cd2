"""One database call at a time on a second thread, while the caller prepares the next.

`episode import` copies a batch while it parses and admits the next one: the database's work on a COPY
(the tsvector, five indexes) and this process's on JSON, the gate and redaction then run at once, on two
cores, instead of in turn (docs/benchmarks.md).
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import psycopg

# While a call runs, the interpreter offers the other thread the GIL every SWITCH seconds, not every 5 ms:
# the copying thread mostly waits on the socket, and each time it wakes it needs the GIL back from a caller
# busy parsing. At 5 ms a wake-up could cost more than the statement it waited for; against a fast server
# the copying thread wakes so often that 0.5 ms still left the server waiting on it, and less than 0.1 ms
# was no faster (the figures: docs/benchmarks.md, tests/bench/import_.py). Only a thread that wants the
# GIL makes the other let go, so a slower server, whose copying thread waits on the socket instead, pays
# nothing for it.
SWITCH = 0.0001


class Overlap:
    """`run(call, *args)` starts the call on a second thread and returns; the next `run`, `wait`, or leaving
    the block waits for it and raises what it raised. One call at a time, in order.

    `run(call, *args, held=True)` passes the call a `release` keyword and returns once it has called it (or
    ended): what the call does before that runs alone, with the GIL its own (an import plans a batch's
    folding, a few short statements and a loop, before it streams the COPY the caller can work beside).

    The connection the calls use is theirs until the last has returned: the caller must not touch it in
    between. Leaving the block on the caller's own error cancels the running statement (as psycopg does on
    Ctrl-C) and waits for the call to end, so whatever rolls the transaction back finds the connection free.
    """

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self._switch = sys.getswitchinterval()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def run(self, call: Callable[..., Any], *args: Any, held: bool = False) -> None:
        self.wait()
        released = threading.Event()
        kwargs = {"release": released.set} if held else {}

        def target() -> None:
            try:
                call(*args, **kwargs)
            except BaseException as exc:  # raised in the caller's thread by wait()
                self._error = exc
            finally:
                released.set()

        # A daemon: a process that ends on a signal does not wait for a statement the server may never answer.
        self._thread = threading.Thread(target=target, name="memctl-overlap", daemon=True)
        self._thread.start()
        if held:
            released.wait()

    def wait(self) -> None:
        if self._thread is None:
            return
        self._thread.join()
        self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def __enter__(self) -> "Overlap":
        self._switch = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch, SWITCH))
        return self

    def __exit__(self, kind, exc, tb) -> None:
        try:
            if exc is None:
                self.wait()
            elif self._thread is not None:
                self.conn.cancel_safe()
                self._thread.join()
                self._thread, self._error = None, None  # the caller's error is the one to report
        finally:
            sys.setswitchinterval(self._switch)
