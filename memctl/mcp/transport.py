"""`memctl mcp`'s stdio transport: the SDK's, with the end of input held back until every request is answered.

The SDK's dispatcher takes the end of input as the client gone and cancels the requests still
running (mcp.shared.jsonrpc_dispatcher). But a client may close its end once it has sent its
requests and still read the answers: a shell pipeline (`printf ... | memctl mcp`), or the protocol's
own shutdown for stdio (close the server's input, wait for it to exit). A `remember` sent just
before would then be stored, or not, without the client ever being told which. Here the server
sees the end of input only once every request read before it has been answered, or after
ANSWER_GRACE seconds; a request the client cancelled is owed nothing.
"""

from __future__ import annotations

from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCError, JSONRPCNotification, JSONRPCRequest, JSONRPCResponse

# Seconds the end of input waits for the answers still owed: longer than a tool call takes
# (search's own timeouts are seconds), short enough that a hung call never keeps the process.
ANSWER_GRACE = 60.0


class Owed:
    """The ids of the requests read from the client and not answered yet."""

    def __init__(self) -> None:
        self.ids: set[Any] = set()
        self._changed = anyio.Event()

    def read(self, message: Any) -> None:
        if isinstance(message, JSONRPCRequest):
            self.ids.add(message.id)
        elif isinstance(message, JSONRPCNotification) and message.method == "notifications/cancelled":
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


async def serve(server: MCPServer, grace: float = ANSWER_GRACE) -> None:
    """Serve `server` over stdio until the client closes its end and has its answers."""
    owed = Owed()
    async with stdio_server() as (stdin, stdout):
        to_server, server_reads = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        server_writes, from_server = anyio.create_memory_object_stream[SessionMessage](0)

        async def relay_input() -> None:
            async with stdin, to_server:
                async for item in stdin:
                    if isinstance(item, SessionMessage):
                        owed.read(item.message)
                    await to_server.send(item)
                with anyio.move_on_after(grace):  # the client is done sending: the answers it is owed first
                    await owed.paid()

        async def relay_output() -> None:
            async with from_server, stdout:
                async for item in from_server:
                    await stdout.send(item)
                    owed.written(item.message)

        lowlevel = server._lowlevel_server  # MCPServer.run_stdio_async's own server, with these streams instead
        async with anyio.create_task_group() as reading:
            reading.start_soon(relay_input)
            async with anyio.create_task_group() as writing:
                writing.start_soon(relay_output)
                await lowlevel.run(server_reads, server_writes, lowlevel.create_initialization_options())
            reading.cancel_scope.cancel()  # the server ended (its input did, or it failed): stop reading
