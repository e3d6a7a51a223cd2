"""memctl mcp: an agent's memory over the Model Context Protocol (stdio), scoped to one agent."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from memctl.cli.common import settings, target, warn


def register(root: typer.Typer) -> None:
    root.command("mcp")(mcp)


def mcp(
    agent: Annotated[Optional[str], typer.Option(
        "--agent", "-a", help="Serve this agent only: its episodes, and facts in its namespace. Without it: the "
                              "operator's view of every agent.", show_default=False)] = None,
    namespace: Annotated[Optional[str], typer.Option(
        "--namespace", "-n", help="The facts' namespace, read and written (default: the agent's name, else "
                                  "'default').", show_default=False)] = None,
    shared_namespace: Annotated[Optional[list[str]], typer.Option(
        "--shared-namespace", help="A namespace the agent may also read, never write (repeatable).",
        show_default=False)] = None,
    read_only: Annotated[bool, typer.Option(
        "--read-only", help="Offer no write tool at all (no remember, no fact_set); hits are not counted as "
                            "accessed.")] = False,
    source: Annotated[Optional[str], typer.Option(
        "--source", "-s", help="Source of what the agent writes (default mcp:AGENT): `memctl source block` and "
                               "`purge --source` act on it.", show_default=False)] = None,
) -> None:
    """Serve memory to an agent over MCP on stdin/stdout (for Claude Code, Claude Desktop, Cursor, ...).

    Tools: remember, search, recall, episode_get, fact_get, fact_list, fact_set, fact_history, runbook_list,
    runbook_show. None deletes, purges or runs a runbook. stdout carries the protocol only; messages go to
    stderr. Start one server per agent: `claude mcp add memctl -- memctl mcp --agent deploy-bot`.
    """
    from memctl import db
    from memctl.mcp import tools

    scope = tools.Scope.make(agent=agent, namespace=namespace, shared=shared_namespace, read_only=read_only,
                                  source=source)
    session = tools.Session(settings(), scope, lambda: db.open_database(target(), report=warn, vector=True))
    warn(f"mcp: {scope.describe()}; {len(tools.offered(scope))} tools over stdio")
    from memctl.mcp import protocol

    try:
        protocol.serve(session)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    finally:
        session.close()
