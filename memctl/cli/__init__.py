"""The command line: one typer sub-app per noun, joined here; no SQL in this package."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup

from memctl import __version__
from memctl.cli import common
from memctl.cli.common import warn
from memctl.errors import EXIT_ERROR, EXIT_UNAVAILABLE, MemctlError


class MemctlGroup(TyperGroup):
    """Turns expected errors into one line on stderr and an exit code, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except MemctlError as exc:
            warn(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except BrokenPipeError:
            raise typer.Exit(EXIT_ERROR) from None
        except Exception as exc:
            code = _database_error_code(exc)
            if code is None:
                raise
            from memctl.config import mask_url

            warn(mask_url(f"database error: {str(exc).strip()}"))
            raise typer.Exit(code) from None
        finally:
            common.close_all()


def _database_error_code(exc: Exception) -> int | None:
    psycopg = sys.modules.get("psycopg")
    if psycopg is None or not isinstance(exc, psycopg.Error):
        return None
    if isinstance(exc, psycopg.OperationalError):
        return EXIT_UNAVAILABLE
    return EXIT_ERROR


app = typer.Typer(
    cls=MemctlGroup,
    help="memctl: agent memory on PostgreSQL + pgvector.\n\n"
    "Facts (keyed, editable, with history), episodes (an append-only log searched by meaning "
    "and by words), runbooks (procedures in git, run exactly).",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"memctl {__version__}\n")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    database_url: Annotated[
        Optional[str],
        typer.Option(
            "--database-url",
            help="libpq URL of the database (else MEMCTL_DATABASE_URL, else database_url in the config file, "
            "else the embedded server).",
            show_default=False,
        ),
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    common.reset().database_url = database_url


def _register() -> None:
    from memctl.cli import config as config_cli
    from memctl.cli import db as db_cli
    from memctl.cli import fact as fact_cli

    app.add_typer(db_cli.app, name="db")
    app.add_typer(config_cli.app, name="config")
    app.add_typer(fact_cli.app, name="fact")
    for name in ("episode", "embed", "timing", "status", "retention", "runbook", "size", "reembed", "recall", "systemd"):
        try:
            module = __import__(f"memctl.cli.{name}", fromlist=["register"])
        except ModuleNotFoundError as exc:
            if exc.name != f"memctl.cli.{name}":
                raise
            continue
        module.register(app)


_register()


def main() -> None:
    try:
        app()
    except BrokenPipeError:
        sys.stderr.close()
        sys.exit(EXIT_ERROR)
