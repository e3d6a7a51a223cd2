"""memctl agent: agents as principals, each a PostgreSQL role under row-level security (docs/agents.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from memctl.cli.common import FormatOption, connect, warn
from memctl.cli.render import Format, render, render_one
from memctl.records import agents

app = typer.Typer(
    help="Agents as principals: each registered agent has its own PostgreSQL role, kept to its own "
    "memory by row-level security, and a bearer token for `memctl mcp --http`.",
    no_args_is_help=True,
)
COLUMNS = ["name", "role", "namespace", "shared", "read_only", "token", "login", "created_at"]
LoginFileOption = Annotated[
    Optional[Path],
    typer.Option(
        "--login-file",
        help="Where the login's URL (password included) is written, mode 0600 (default: "
        "MEMCTL_HOME/agents/NAME.url); - prints it once on stdout.",
        show_default=False,
    ),
]


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="agent")


def _row(agent: agents.Agent) -> dict:
    row = agent.to_dict()
    row["shared"] = ",".join(row["shared"])
    return row


@app.command("add")
def add(
    name: Annotated[
        str,
        typer.Argument(
            help="The agent's name, as `memctl mcp --agent` and episodes' agent give it."
        ),
    ],
    namespace: Annotated[
        Optional[str],
        typer.Option(
            "--namespace",
            "-n",
            help="The facts' namespace it reads and writes (default: its name).",
            show_default=False,
        ),
    ] = None,
    shared_namespace: Annotated[
        Optional[list[str]],
        typer.Option(
            "--shared-namespace",
            help="A namespace it may also read, never write (repeatable).",
            show_default=False,
        ),
    ] = None,
    read_only: Annotated[
        bool, typer.Option("--read-only", help="It writes nothing: its role has no write grant.")
    ] = False,
    print_sql: Annotated[
        bool,
        typer.Option(
            "--print-sql",
            help="Print the statements a role with CREATEROLE runs to make the agent's role (for a DBA), "
            "and register nothing.",
        ),
    ] = False,
    login: Annotated[
        bool,
        typer.Option(
            "--login",
            help="Also let the agent's own client log in as its role, to read its memory with SQL: a "
            "generated password, kept in --login-file.",
        ),
    ] = False,
    login_file: LoginFileOption = None,
    fmt: FormatOption = Format.table,
) -> None:
    """Register an agent: its role (assumed by memctl's servers), grants and scope. No token yet:
    `memctl agent token NAME` issues one."""
    conn = connect()
    if print_sql:
        sys.stdout.write(agents.print_sql(conn, name, read_only=read_only))
        return
    agent = agents.add(
        conn, name, namespace=namespace, shared=shared_namespace, read_only=read_only
    )
    if login:
        _write_login(name, agents.login(conn, name), login_file)
        agent = agents.show(conn, name)
    if login_file is None or str(login_file) != "-":
        render_one(_row(agent), fmt)
    for gap in agents.open_gaps(conn):
        warn(f"agents' wall: left open, as this role may not close it: {gap}")


@app.command("login")
def login_(
    name: Annotated[str, typer.Argument(help="A registered agent.")],
    login_file: LoginFileOption = None,
) -> None:
    """Give the agent's role a login with a new generated password (any earlier one stops working), a connection
    limit and its sessions' timeouts ([agents]). Its client reads its memory with SQL and writes nothing: writes
    go through `memctl mcp`."""
    _write_login(name, agents.login(connect(), name), login_file)


def _write_login(name: str, url: str, path: Path | None) -> None:
    from memctl import files
    from memctl.db import embedded

    if path is not None and str(path) == "-":
        sys.stdout.write(url + "\n")
        warn(f"login for agent {name!r}: its URL, password included, printed once")
        return
    target = path or embedded.memctl_home() / "agents" / f"{name}.url"
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    files.write_text(files.regular_target(target, "--login-file"), url + "\n")
    warn(
        f"login for agent {name!r}: its URL, password included, is in {target} (mode 0600); its sessions read its "
        "memory and write nothing"
    )


@app.command("list")
def list_(fmt: FormatOption = Format.table) -> None:
    """Registered agents: role, namespaces, read-only, whether a token is issued (never the token)."""
    render(
        [_row(a) for a in agents.list_agents(connect())],
        fmt,
        columns=COLUMNS if fmt in (Format.table, Format.csv) else None,
    )


@app.command("show")
def show(
    name: Annotated[str, typer.Argument(help="A registered agent.")],
    fmt: FormatOption = Format.table,
) -> None:
    """One agent; exit 4 if it is not registered."""
    render_one(_row(agents.show(connect(), name)), fmt)


@app.command("token")
def token(name: Annotated[str, typer.Argument(help="A registered agent.")]) -> None:
    """Issue a new bearer token and print it, alone, once: `TOKEN=$(memctl agent token bot)`. Only its hash is
    stored; the agent's earlier token stops working at once."""
    issued = agents.issue_token(connect(), name)
    sys.stdout.write(issued + "\n")
    warn(
        f"token issued for agent {name!r}: shown once, stored only as a hash; any earlier one is refused now"
    )


@app.command("revoke")
def revoke(name: Annotated[str, typer.Argument(help="A registered agent.")]) -> None:
    """Unregister an agent: its token and registration go, its role is dropped; its servers refuse it from their
    next call. Its memory stays (the operator's to purge)."""
    done = agents.revoke(connect(), name)
    said = [f"ended {done['sessions_ended']} of its sessions"] if done["sessions_ended"] else []
    if done["large_objects"] or done["objects"]:
        said.append(
            f"took over what it owned here ({done['large_objects']} large object(s), {done['objects']} other "
            "object(s)), now memctl's role's"
        )
    if done["dropped"]:
        warn(f"revoked agent {name!r}; " + "; ".join([*said, f"dropped role {done['role']}"]))
    else:
        warn(
            f"revoked agent {name!r}; "
            + "; ".join(
                [*said, f"its role {done['role']} is left, and sees nothing here: {done['left']}"]
            )
        )
