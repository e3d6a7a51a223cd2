"""memctl systemd: render or install the units of the scheduled jobs (no database needed)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from memctl.cli.common import warn
from memctl.upkeep import systemd

app = typer.Typer(
    help="systemd units that run `memctl embed` every 5 minutes, and `memctl summarize` then `memctl prune --yes` "
    "daily.",
    no_args_is_help=True,
)

BinOption = Annotated[
    Optional[str],
    typer.Option("--bin", help="Absolute path of memctl for ExecStart= [default: the running memctl].",
                 show_default=False),
]
UserOption = Annotated[str, typer.Option("--user", help="The system user the jobs run as.")]
EnvFileOption = Annotated[
    str, typer.Option("--env-file", help="Optional EnvironmentFile= with MEMCTL_* settings and secrets.")
]


def _render(bin_path: str | None, user: str, env_file: str) -> dict[str, str]:
    bin_path = bin_path or systemd.default_bin()
    units = systemd.render_units(bin_path, user, env_file)
    for problem in systemd.placement_problems(bin_path, user):
        warn(f"warning: {problem}")
    return units


@app.command()
def render(
    out: Annotated[
        Optional[Path],
        typer.Option("--out", help="Write the units into this directory (created if missing) and list them; "
                     "without it, print them.", show_default=False),
    ] = None,
    bin_path: BinOption = None,
    user: UserOption = systemd.DEFAULT_USER,
    env_file: EnvFileOption = systemd.DEFAULT_ENV_FILE,
) -> None:
    """Render the units (embed, summarize, prune: a service and a timer each) with the paths filled in."""
    units = _render(bin_path, user, env_file)
    if out is None:
        sys.stdout.write("\n".join(f"# --- {name} ---\n{text}" for name, text in units.items()))
        return
    for path in systemd.write_units(units, out):
        sys.stdout.write(f"{path}\n")


@app.command()
def install(
    dest: Annotated[Path, typer.Option("--dest", help="Directory the units are written to.")]
    = systemd.DEFAULT_DEST,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Write nothing; say what would be written.")] = False,
    bin_path: BinOption = None,
    user: UserOption = systemd.DEFAULT_USER,
    env_file: EnvFileOption = systemd.DEFAULT_ENV_FILE,
) -> None:
    """Write the units to /etc/systemd/system and print the commands that enable them.

    memctl never runs systemctl or useradd itself: the commands go to stdout.
    """
    units = _render(bin_path, user, env_file)
    if dry_run:
        for name in units:
            warn(f"would write {dest / name}")
    else:
        for path in systemd.write_units(units, dest, create=False):
            warn(f"wrote {path}")
    if not Path(env_file).exists():
        warn(f"note: {env_file} does not exist; the jobs use memctl's defaults until it does")
    for command in systemd.enable_commands(user):
        sys.stdout.write(f"{command}\n")


def register(app_: typer.Typer) -> None:
    app_.add_typer(app, name="systemd")
