"""`memctl mcp`'s stdio transport: JSON-RPC lines, the end of input held back until every request is answered.

The end of input. The SDK's dispatcher takes it as the client gone and cancels the requests still
running (mcp.shared.jsonrpc_dispatcher). But a client may close its end once it has sent its
requests and still read the answers: a shell pipeline (`printf ... | memctl mcp`), or the protocol's
own shutdown for stdio (close the server's input, wait for it to exit). A `remember` sent just
before would then be stored, or not, without the client ever being told which. Here the server
sees the end of input only once every request read before it has been answered, or after
ANSWER_GRACE seconds; a request the client cancelled is owed nothing.

The wire. When stdin and stdout are pipes or sockets (an agent's client starts `memctl mcp` with
pipes), they are read and written by the event loop itself. The SDK's stdio_server reads each line
and writes and flushes each answer in a worker thread: three thread hops a call, about half a
millisecond, more than the rest of the protocol costs (docs/benchmarks.md). Anything else (a file,
a terminal, which must not be put in non-blocking mode under the shell) goes through the SDK's
stdio_server as it is. Either way, while serving, descriptor 0 reads the null device and 1 writes to
stderr, so nothing but the protocol reaches the client's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import anyio
import mcp_types as types
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCError, JSONRPCNotification, JSONRPCRequest, JSONRPCResponse

log = logging.getLogger("memctl.mcp")

# Seconds the end of input waits for the answers still owed: longer than a tool call takes
# (search's own timeouts are seconds), short enough that a hung call never keeps the process.
ANSWER_GRACE = 60.0


def line_limit(largest_text: int) -> int:
    """The longest request line held in memory: one text of at most `largest_text` bytes (memctl's [limits]
    episode_bytes or value_bytes), each byte escaped as JSON in up to 6 (\\u0000), and a mebibyte for the
    rest. A longer line is skipped and answered as an error, so a client cannot grow the buffer unbounded."""
    return 6 * largest_text + 2**20


class Owed:
    """The ids of the requests read from the client and not answered yet."""

    def __init__(self) -> None:
        self.ids: set[Any] = set()
        self._changed = anyio.Event()

    def read(self, message: Any) -> None:
        if isinstance(message, JSONRPCRequest):
            self.ids.add(message.id)
        elif (
            isinstance(message, JSONRPCNotification) and message.method == "notifications/cancelled"
        ):
            self._settle((message.params or {}).get("requestId"))

    def written(self, message: Any) -> None:
        if isinstance(message, (JSONRPCResponse, JSONRPCError)):
            self._settle(message.id)

    def _settle(self, request_id: Any) -> None:
        self.ids.discard(request_id)
        self._changed.set()
        self._changed = anyio.Event()

    async def paid(self) -> None:
        """Return once nothing is owed."""
        while self.ids:
            await self._changed.wait()


def _is_pipe(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def on_pipes() -> bool:
    """Whether stdin and stdout are both pipes or sockets, which the event loop can read and write itself."""
    return _is_pipe(0) and _is_pipe(1)


@contextlib.contextmanager
def _claimed_wire():
    """Private copies of descriptors 0 and 1 for the protocol; 0 reads the null device and 1 writes to stderr
    meanwhile (a child process or a stray print reaches neither end of the wire). Restored on exit."""
    wire_in = os.dup(0)  # not inherited by children (os.dup's copies are close-on-exec)
    wire_out = os.dup(1)
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            os.dup2(null, 0)
        finally:
            os.close(null)
        os.dup2(2, 1)
        yield wire_in, wire_out
    finally:
        for fd, wire in ((0, wire_in), (1, wire_out)):
            with contextlib.suppress(OSError):
                os.set_blocking(
                    wire, True
                )  # the event loop made it non-blocking; the shell may share it
                os.dup2(wire, fd)
            os.close(wire)


Lines = AsyncIterator[bytes | Exception]


@contextlib.asynccontextmanager
async def _pipes(limit: int) -> AsyncIterator[tuple[Lines, Callable[[bytes], Awaitable[None]]]]:
    """The wire's lines in (an overlong one as an error), and a function writing one out, on the event loop."""
    loop = asyncio.get_running_loop()
    with _claimed_wire() as (wire_in, wire_out):
        reader = asyncio.StreamReader(limit=limit)
        in_transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader),
            os.fdopen(wire_in, "rb", buffering=0, closefd=False),
        )
        out_transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(wire_out, "wb", buffering=0, closefd=False)
        )
        writer = asyncio.StreamWriter(out_transport, protocol, None, loop)

        async def write(data: bytes) -> None:
            writer.write(data)
            await writer.drain()

        try:
            yield lines(reader), write
        finally:
            in_transport.close()
            out_transport.close()


async def lines(reader: asyncio.StreamReader) -> Lines:
    """The lines of `reader`, each with its newline (the last may have none); a line longer than the reader's
    limit is skipped and given as an error, and the lines after it are read as usual."""
    while True:
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as end:
            if end.partial:
                yield end.partial
            return
        except asyncio.LimitOverrunError:
            await _skip_line(reader)
            yield ValueError("a line longer than the server reads was skipped")
            continue
        yield line


async def _skip_line(reader: asyncio.StreamReader) -> None:
    """Read past the end of an overlong line, a buffer's worth at a time."""
    while True:
        try:
            await reader.readuntil(b"\n")
            return
        except asyncio.LimitOverrunError as more:
            await reader.readexactly(more.consumed)
        except asyncio.IncompleteReadError:
            return


def _parse(line: bytes) -> SessionMessage | Exception:
    """One line of the wire as the SDK's stdio transport parses it (invalid UTF-8 replaced, not fatal)."""
    try:
        return SessionMessage(
            types.jsonrpc_message_adapter.validate_json(
                line.decode("utf-8", "replace"), by_name=False
            )
        )
    except Exception as exc:  # the dispatcher answers it (or logs it) and goes on
        return exc


def refusal(line: bytes | None, problem: Exception) -> SessionMessage:
    """The answer to a line that is no JSON-RPC message, which the SDK would only log: JSON-RPC 2.0's Parse error
    (not JSON) or Invalid Request (JSON, not a request; a line too long), with the id the line names if any, else
    null, so the client that sent it hears back instead of waiting."""
    import json

    code, said, request_id = (
        types.INVALID_REQUEST,
        "Invalid Request: not a JSON-RPC 2.0 message",
        None,
    )
    try:
        value = json.loads(line) if line is not None else None
    except ValueError:
        code, said = types.PARSE_ERROR, "Parse error: the line is not JSON"
    else:
        if (
            isinstance(value, dict)
            and isinstance(value.get("id"), (str, int))
            and not isinstance(value["id"], bool)
        ):
            request_id = value["id"]
    if line is None:
        said = f"Invalid Request: {problem}"
    return SessionMessage(
        JSONRPCError(jsonrpc="2.0", id=request_id, error=types.ErrorData(code=code, message=said))
    )


# A client gone from its end of our output: the write that found it so, and what it broke after it.
GONE = (BrokenPipeError, ConnectionResetError)
AFTER_GONE = (*GONE, anyio.BrokenResourceError, anyio.ClosedResourceError)


def _reader_gone(group: BaseExceptionGroup) -> bool:
    """Whether the serving failed only because the client stopped reading our output."""
    found = group.subgroup(lambda exc: isinstance(exc, GONE))
    other = group.subgroup(lambda exc: not isinstance(exc, (BaseExceptionGroup, *AFTER_GONE)))
    return found is not None and other is None


async def serve(server: MCPServer, limit: int, grace: float = ANSWER_GRACE) -> None:
    """Serve `server` over stdio until the client closes its end and has its answers, or until nobody reads
    its answers any more (one warning line, no traceback: the client is gone, an error would reach no one).
    `limit`: the longest line read from pipes (line_limit)."""
    owed = Owed()
    try:
        if on_pipes():
            await _serve_pipes(server, owed, grace, limit)
        else:
            await _serve_files(server, owed, grace)
    except BaseExceptionGroup as group:
        if not _reader_gone(group):
            raise
        log.warning("the client stopped reading; %d answer(s) not delivered", len(owed.ids))


def _streams() -> tuple:
    return (
        *anyio.create_memory_object_stream[SessionMessage | Exception](0),
        *anyio.create_memory_object_stream[SessionMessage](0),
    )


async def _run(
    server: MCPServer,
    streams: tuple,
    receive_input: Callable[[], Coroutine[Any, Any, None]],
    send_output: Callable[[], Coroutine[Any, Any, None]],
) -> None:
    """The SDK's server between the two relays (MCPServer.run_stdio_async's own server, other streams)."""
    _, server_reads, server_writes, _ = streams
    # MCPServer (mcp 2.1-2.3) has no public way to run on streams of one's own: run_stdio_async reads
    # the process's stdin itself, with no bound on a line. The SDK reads this attribute itself to do
    # it (mcp/client/_memory.py: "TODO(Marcelo): Make `lowlevel_server` public.").
    lowlevel = server._lowlevel_server
    async with anyio.create_task_group() as reading:
        reading.start_soon(receive_input)
        async with anyio.create_task_group() as writing:
            writing.start_soon(send_output)
            await lowlevel.run(
                server_reads, server_writes, lowlevel.create_initialization_options()
            )
        reading.cancel_scope.cancel()  # the server ended (its input did, or it failed): stop reading


async def _end_of_input(owed: Owed, grace: float) -> None:
    with anyio.move_on_after(grace):  # the client is done sending: the answers it is owed first
        await owed.paid()


async def _serve_pipes(server: MCPServer, owed: Owed, grace: float, limit: int) -> None:
    streams = _streams()
    to_server, _, _, from_server = streams
    async with _pipes(limit) as (lines, write):

        async def receive_input() -> None:
            async with to_server:
                async for line in lines:
                    item = line if isinstance(line, Exception) else _parse(line)
                    if isinstance(item, Exception):
                        refused = refusal(None if isinstance(line, Exception) else line, item)
                        await write(
                            refused.message.model_dump_json(
                                by_alias=True, exclude_unset=True
                            ).encode()
                            + b"\n"
                        )
                        continue
                    owed.read(item.message)
                    await to_server.send(item)
                await _end_of_input(owed, grace)

        async def send_output() -> None:
            async with from_server:
                async for item in from_server:
                    await write(
                        item.message.model_dump_json(by_alias=True, exclude_unset=True).encode()
                        + b"\n"
                    )
                    owed.written(item.message)

        await _run(server, streams, receive_input, send_output)


async def _serve_files(server: MCPServer, owed: Owed, grace: float) -> None:
    streams = _streams()
    to_server, _, _, from_server = streams
    async with stdio_server() as (stdin, stdout):

        async def relay_input() -> None:
            async with stdin, to_server:
                async for item in stdin:
                    if isinstance(item, Exception):
                        await stdout.send(refusal(None, item))
                        continue
                    owed.read(item.message)
                    await to_server.send(item)
                await _end_of_input(owed, grace)

        async def relay_output() -> None:
            async with from_server, stdout:
                async for item in from_server:
                    await stdout.send(item)
                    owed.written(item.message)

        await _run(server, streams, relay_input, relay_output)
