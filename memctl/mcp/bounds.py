"""The bounds of `memctl mcp --http` ([http]): how long a request may take to arrive, how long a kept-alive
connection may idle, how many connections may be open at once, in all and from one client address.

uvicorn closes a kept-alive connection that idles past timeout_keep_alive, but nothing else: a connection
that never finishes its headers, or never sends any, stays open for good (measured: 40 of 40 still open
after 75 s), and any number may be opened. Bounded here is uvicorn's own h11 protocol, given to it as
its `http` class: a timer from the connection's start (and from each response's end) that closes the
connection unless a whole request (headers and body) has arrived within header_timeout, and counts of
open connections checked when one is made: past either limit it is answered 503 and closed at once, before
a byte of it is read. A request being served is never cut: its time is the tool's.

`GET /mcp` asks for a stream of server-initiated messages, which a stateless server never sends: the
streamable HTTP transport lets a server answer 405 Method Not Allowed (only_post), rather than hold the
stream open with nothing in it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from memctl.config import Settings, parse_duration

BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n"
    b"Content-Length: 21\r\n\r\ntoo many connections\n"
)


@dataclass
class Limits:
    header_timeout: float
    idle_timeout: float
    total: int
    per_client: int
    open: dict[str, int] = field(default_factory=dict)  # client address -> connections open now

    @classmethod
    def of(cls, settings: Settings) -> "Limits":
        http = settings.http
        return cls(
            parse_duration(http.header_timeout),
            parse_duration(http.idle_timeout),
            http.max_connections,
            http.max_connections_per_client,
        )


def protocol(limits: Limits) -> type[H11Protocol]:
    """uvicorn's h11 protocol, bounded by `limits` (one object for the server: its counts are every connection's)."""

    class Bounded(H11Protocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._peer: str | None = self.client[0] if self.client else ""
            self._arrival: asyncio.TimerHandle | None = None
            counted = limits.open.get(self._peer, 0)
            if sum(limits.open.values()) >= limits.total or counted >= limits.per_client:
                self._peer = None  # not counted
                transport.write(BUSY)
                transport.close()
                return
            limits.open[self._peer] = counted + 1
            self._await_request()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_waiting()
            if self._peer is not None:
                left = limits.open.get(self._peer, 1) - 1
                if left > 0:
                    limits.open[self._peer] = left
                else:
                    limits.open.pop(self._peer, None)
                self._peer = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._arrival is None and self.conn.their_state is h11.IDLE:
                self._await_request()  # the first bytes of a request on a kept-alive connection
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE and self.conn.their_state is not h11.SEND_BODY:
                self._stop_waiting()  # the whole request is here (or the connection is ending)

        def _await_request(self) -> None:
            self._stop_waiting()
            self._arrival = self.loop.call_later(limits.header_timeout, self._too_slow)

        def _stop_waiting(self) -> None:
            arrival = getattr(self, "_arrival", None)  # None before connection_made set it
            if arrival is not None:
                arrival.cancel()
                self._arrival = None

        def _too_slow(self) -> None:
            self._arrival = None
            if not self.transport.is_closing() and self.conn.their_state in (
                h11.IDLE,
                h11.SEND_BODY,
            ):
                self.transport.close()

    return Bounded


def only_post(app: Any, path: str = "/mcp") -> Any:
    """The app, but `GET path` answered 405 (Allow: POST) at once: no stream is held open with nothing in it."""

    async def bounded(scope: dict, receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "GET"
            and scope["path"].rstrip("/") == path
        ):
            await send(
                {
                    "type": "http.response.start",
                    "status": 405,
                    "headers": [
                        (b"allow", b"POST"),
                        (b"content-type", b"text/plain; charset=utf-8"),
                        (b"content-length", b"19"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": b"method not allowed\n"})
            return
        await app(scope, receive, send)

    return bounded


def config_options(settings: Settings) -> dict:
    """uvicorn.Config's options for [http]: the bounded protocol, and the idle timeout as its keep-alive timeout."""
    limits = Limits.of(settings)
    return {"http": protocol(limits), "timeout_keep_alive": limits.idle_timeout}
