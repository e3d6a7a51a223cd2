"""memctl mcp: agents' memory over the Model Context Protocol: stdio for one agent, or streamable HTTP for many."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from memctl.cli.common import settings, target, warn


def register(root: typer.Typer) -> None:
    root.command("mcp")(mcp)


# The help's list of tools is memctl.mcp.tools.TOOLS written out (the catalogue is not imported to build
# the help), held to it by tests/test_mcp.py.
def mcp(
    agent: Annotated[
        Optional[str],
        typer.Option(
            "--agent",
            "-a",
            help="Serve this agent only: its episodes, and facts in its namespace. Without it: the "
            "operator's view of every agent.",
            show_default=False,
        ),
    ] = None,
    namespace: Annotated[
        Optional[str],
        typer.Option(
            "--namespace",
            "-n",
            help="The facts' namespace, read and written (default: the agent's name, else "
            "'default').",
            show_default=False,
        ),
    ] = None,
    shared_namespace: Annotated[
        Optional[list[str]],
        typer.Option(
            "--shared-namespace",
            help="A namespace the agent may also read, never write (repeatable).",
            show_default=False,
        ),
    ] = None,
    read_only: Annotated[
        bool,
        typer.Option(
            "--read-only",
            help="Offer no write tool at all (no remember, no fact_set); hits are not counted as "
            "accessed.",
        ),
    ] = False,
    source: Annotated[
        Optional[str],
        typer.Option(
            "--source",
            "-s",
            help="Source of what the agent writes (default mcp:AGENT): `memctl source block` and "
            "`purge --source` act on it.",
            show_default=False,
        ),
    ] = None,
    http: Annotated[
        Optional[str],
        typer.Option(
            "--http",
            help="Serve streamable HTTP at http://[HOST:]PORT/mcp instead of stdio, for every registered agent: "
            "each request's agent is its bearer token's (HOST default 127.0.0.1).",
            show_default=False,
            metavar="[HOST:]PORT",
        ),
    ] = None,
    allow_origin: Annotated[
        Optional[list[str]],
        typer.Option(
            "--allow-origin",
            help="With --http: an Origin a browser-based client may send (repeatable; loopback "
            "origins are allowed; any other is refused).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve memory to an agent over MCP on stdin/stdout (for Claude Code, Claude Desktop, Cursor, ...).

    Tools: remember, search, recall, episode_get, fact_get, fact_list, fact_set, fact_history, runbook_list,
    runbook_show. None deletes, purges or runs a runbook. stdout carries the protocol only; messages go to
    stderr. Start one server per agent: `claude mcp add memctl -- memctl mcp --agent deploy-bot`.
    """
    from memctl import db
    from memctl.mcp import sessions, tools

    def open_connection():
        return db.open_database(target(), report=warn, vector=True, settings=settings())

    if http is not None:
        from memctl.mcp import http as http_mod

        if agent or namespace or shared_namespace or read_only or source:
            from memctl.errors import UsageError

            raise UsageError(
                "--http serves every registered agent, each by its token: --agent, --namespace, "
                "--shared-namespace, --read-only and --source are the registry's (memctl agent add)"
            )
        host, port = http_mod.parse_address(http)
        http_mod.serve(
            settings(), open_connection, host, port, origins=allow_origin or [], warn=warn
        )
        return
    if allow_origin:
        from memctl.errors import UsageError

        raise UsageError("--allow-origin needs --http")
    from memctl.mcp import principals

    asked = sessions.Scope.make(
        agent=agent,
        namespace=namespace,
        shared=shared_namespace,
        read_only=read_only,
        source=source,
    )
    scope = principals.resolve(
        open_connection,
        asked,
        namespace_given=namespace is not None,
        shared_given=bool(shared_namespace),
        source=source,
        warn=warn,
    )
    session = sessions.Session(settings(), scope, open_connection)
    warn(f"mcp: {scope.describe()}; {len(tools.offered(scope))} tools over stdio")
    from memctl.mcp import protocol

    try:
        protocol.serve(
            session
        )  # until stdin ends (exit 0), or SIGINT/SIGTERM (130, 143: memctl.interrupts)
    finally:
        session.close()
