"""memctl config: where the file is and what is in effect."""

from __future__ import annotations

import shlex
import sys
from typing import Annotated

import typer

from memctl import config as config_mod
from memctl.cli.common import FormatOption, settings
from memctl.cli.render import Format, render

app = typer.Typer(
    help="Configuration: TOML at $XDG_CONFIG_HOME/memctl/config.toml or $MEMCTL_CONFIG.",
    no_args_is_help=True,
)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="config")


@app.command()
def show(fmt: FormatOption = Format.table) -> None:
    """Effective settings with where each came from (default, file, env); secrets masked."""
    render(config_mod.shown_settings(settings()), fmt)


@app.command()
def path() -> None:
    """Print the path of the configuration file (whether or not it exists)."""
    sys.stdout.write(f"{config_mod.config_path()}\n")


@app.command("pg-service")
def pg_service(
    directory: Annotated[
        str, typer.Argument(help="An existing private directory (e.g. from mktemp -d).")
    ],
) -> None:
    """Write the database connection as a libpq service file (and passfile, mode 0600) in DIRECTORY.

    Prints shell assignments of PGSERVICEFILE and PGSERVICE, which psql, pg_dump and pg_restore then use,
    so a shell step never puts the URL on a command line, where `ps` shows it:
    `pgenv="$(memctl config pg-service "$dir")"; eval "$pgenv"` (the assignment first, so that `sh -e` stops
    if it fails; libpq does not expand a URL in PGDATABASE). The database is the one memctl uses
    (--database-url, MEMCTL_DATABASE_URL, the file, else the embedded one, started if needed). Remove
    DIRECTORY afterwards (a trap): the passfile holds the password.
    """
    from memctl.cli.common import target, warn
    from memctl.db import embedded, pgservice

    chosen = target()
    url = chosen.url or (embedded.start(report=warn).url if chosen.embedded else "")
    for name, value in pgservice.write(url, directory).items():
        sys.stdout.write(f"{name}={shlex.quote(value)}; export {name}\n")
