"""memctl agent: agents as principals, each a PostgreSQL role under row-level security (docs/agents.md)."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from memctl.cli.common import FormatOption, connect, warn
from memctl.cli.render import Format, render, render_one
from memctl.records import agents

app = typer.Typer(help="Agents as principals: each registered agent has its own PostgreSQL role, kept to its own "
                       "memory by row-level security, and a bearer token for `memctl mcp --http`.",
                  no_args_is_help=True)
COLUMNS = ["name", "role", "namespace", "shared", "read_only", "token", "created_at"]


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="agent")


def _row(agent: agents.Agent) -> dict:
    row = agent.to_dict()
    row["shared"] = ",".join(row["shared"])
    return row


@app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="The agent's name, as `memctl mcp --agent` and episodes' agent give it.")],
    namespace: Annotated[Optional[str], typer.Option(
        "--namespace", "-n", help="The facts' namespace it reads and writes (default: its name).",
        show_default=False)] = None,
    shared_namespace: Annotated[Optional[list[str]], typer.Option(
        "--shared-namespace", help="A namespace it may also read, never write (repeatable).", show_default=False)] = None,
    read_only: Annotated[bool, typer.Option("--read-only", help="It writes nothing: its role has no write grant.")]
    = False,
    print_sql: Annotated[bool, typer.Option(
        "--print-sql", help="Print the statements a role with CREATEROLE runs to make the agent's role (for a DBA), "
                            "and register nothing.")] = False,
    fmt: FormatOption = Format.table,
) -> None:
    """Register an agent: its role (NOLOGIN, assumed by memctl's servers), grants and scope. No token yet:
    `memctl agent token NAME` issues one."""
    conn = connect()
    if print_sql:
        sys.stdout.write(agents.print_sql(conn, name, read_only=read_only))
        return
    agent = agents.add(conn, name, namespace=namespace, shared=shared_namespace, read_only=read_only)
    render_one(_row(agent), fmt)


@app.command("list")
def list_(fmt: FormatOption = Format.table) -> None:
    """Registered agents: role, namespaces, read-only, whether a token is issued (never the token)."""
    render([_row(a) for a in agents.list_agents(connect())], fmt, columns=COLUMNS if fmt in (Format.table, Format.csv)
           else None)


@app.command("show")
def show(name: Annotated[str, typer.Argument(help="A registered agent.")], fmt: FormatOption = Format.table) -> None:
    """One agent; exit 4 if it is not registered."""
    render_one(_row(agents.show(connect(), name)), fmt)


@app.command("token")
def token(name: Annotated[str, typer.Argument(help="A registered agent.")]) -> None:
    """Issue a new bearer token and print it, alone, once: `TOKEN=$(memctl agent token bot)`. Only its hash is
    stored; the agent's earlier token stops working at once."""
    issued = agents.issue_token(connect(), name)
    sys.stdout.write(issued + "\n")
    warn(f"token issued for agent {name!r}: shown once, stored only as a hash; any earlier one is refused now")


@app.command("revoke")
def revoke(name: Annotated[str, typer.Argument(help="A registered agent.")]) -> None:
    """Unregister an agent: its token and registration go, its role is dropped; its servers refuse it from their
    next call. Its memory stays (the operator's to purge)."""
    done = agents.revoke(connect(), name)
    if done["role_dropped"]:
        warn(f"revoked agent {name!r}; dropped role {done['role']}")
    else:
        warn(f"revoked agent {name!r}; its role {done['role']} could not be dropped by this role (no CREATEROLE) and "
             f"now sees nothing: a DBA runs DROP ROLE {done['role']}")
