"""memctl config: where the file is and what is in effect."""

from __future__ import annotations

import sys

import typer

from memctl import config as config_mod
from memctl.cli.common import FormatOption, settings
from memctl.cli.render import Format, render

app = typer.Typer(help="Configuration: TOML at $XDG_CONFIG_HOME/memctl/config.toml or $MEMCTL_CONFIG.",
                  no_args_is_help=True)


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
