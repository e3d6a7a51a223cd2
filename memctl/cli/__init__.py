"""The command line: one typer sub-app per noun, joined here; no SQL in this package."""

from __future__ import annotations

import contextlib
import sys
from typing import Annotated, Any, Optional

import typer
from typer.core import TyperGroup

from memctl import __version__
from memctl.cli import common
from memctl.cli.common import warn
from memctl.errors import EXIT_ERROR, EXIT_UNAVAILABLE, MemctlError
from memctl import interrupts
from memctl.interrupts import Interrupted


class MemctlGroup(TyperGroup):
    """Turns expected errors into one line on stderr and an exit code, never a traceback."""

    def make_context(self, *args, **kwargs):
        with _clean_usage_error():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        try:
            protected = getattr(ctx, "_protected_args", None)
            _check_arguments([*(ctx.protected_args if protected is None else protected), *ctx.args])
            with _clean_usage_error():
                return super().invoke(ctx)
        except MemctlError as exc:
            exc = _disk_full(exc) or exc
            warn(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except BrokenPipeError:
            _quiet_stdout()
            raise typer.Exit(0) from None
        except (
            Interrupted
        ) as exc:  # SIGINT, SIGTERM (memctl.interrupts): what was in flight is rolled back
            warn(f"stopped by {exc.name}")
            raise typer.Exit(exc.exit_code) from None
        except Exception as exc:
            disk = _disk_full(exc)
            if disk is not None:
                warn(str(disk))
                raise typer.Exit(disk.exit_code) from None
            refused = _schema_refusal(exc)
            if refused is not None:
                warn(str(refused))
                raise typer.Exit(refused.exit_code) from None
            code = _database_error_code(exc)
            if code is None:
                raise
            from memctl.config import mask_secrets

            warn(mask_secrets(f"database error: {str(exc).strip()}"))
            raise typer.Exit(code) from None
        finally:
            common.close_all()
            interrupts.done()


@contextlib.contextmanager
def _clean_usage_error():
    """A usage error quotes what was typed (`No such option: -----BEGIN OPENSSH PRIVATE KEY-----...`): its message
    goes through the filter of every message (common.clean) before click prints it."""
    try:
        yield
    except _CLICK_ERROR as exc:
        exc.message = common.clean(exc.message)
        if getattr(
            exc, "option_name", None
        ):  # typer's panel shows a NoSuchOption by its option_name
            exc.option_name = common.clean(exc.option_name)
        raise


# The usage errors' base class, of the click typer carries within it (typer._click): found from typer's public
# BadParameter, not imported from a private module.
_CLICK_ERROR: Any = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def _check_arguments(args: list[str]) -> None:
    """An argument that is not UTF-8 (Python keeps its bytes as lone surrogates) is refused here, once."""
    from memctl.errors import BadValue

    for number, arg in enumerate(args, start=1):
        if isinstance(arg, str) and not arg.isascii():
            try:
                arg.encode("utf-8")
            except UnicodeEncodeError:
                raise BadValue(
                    f"argument {number} is not valid UTF-8: memctl takes UTF-8 text",
                    f"argument {number}",
                ) from None


def _disk_full(exc: Exception) -> MemctlError | None:
    """A full disk met anywhere (the database's SQLSTATE 53100, a WAL write, ENOSPC on memctl's own
    files), also under another error, as one DiskFull naming that disk; None for any other error."""
    from memctl import db, errors

    if isinstance(exc, errors.DiskFull):
        return None
    psycopg = sys.modules.get("psycopg")
    for link in errors.causes(exc):
        if psycopg is not None and isinstance(link, psycopg.Error):
            text = str(link).strip()
            if isinstance(link, psycopg.errors.DiskFull) or db.NO_SPACE in text:
                return db.disk_full(_target(), text.splitlines()[0])
        elif errors.no_space(link):
            what = str(exc) if isinstance(exc, MemctlError) else (link.strerror or str(link))
            if link.filename:
                return errors.DiskFull.at(link.filename, what)
            output = _full_stdout_file()
            if output is not None:
                return errors.DiskFull.output(output)
            return errors.DiskFull("a disk memctl writes to", what)
    return None


def _full_stdout_file() -> str | None:
    """The file standard output was redirected to, when it is one and its disk has no space left."""
    import os
    import stat

    try:
        if not stat.S_ISREG(os.fstat(1).st_mode) or os.fstatvfs(1).f_bavail > 0:
            return None
        return os.readlink("/proc/self/fd/1")
    except OSError:
        return None


def _target():
    """The database this invocation uses, to name its disk; None when the settings cannot say."""
    try:
        return common.target()
    except Exception:
        return None


def _schema_refusal(exc: Exception):
    """A write the schema refused because a newer memctl migrated it meanwhile (sql/0025): SchemaChanged."""
    from memctl import errors
    from memctl.db import migrate

    for link in errors.causes(exc):
        if migrate.is_guard_refusal(link):
            message = str(link).strip().splitlines()[0] if str(link).strip() else "refused"
            return errors.SchemaChanged(
                f"{message}: nothing of it was stored; stopping so that the memctl installed "
                "now runs it again (a systemd unit restarts it; by hand: upgrade memctl if "
                "it is older than the memory's schema)"
            )
    return None


def _database_error_code(exc: Exception) -> int | None:
    psycopg = sys.modules.get("psycopg")
    if psycopg is None or not isinstance(exc, psycopg.Error):
        return None
    if isinstance(exc, psycopg.OperationalError):
        return EXIT_UNAVAILABLE
    return EXIT_ERROR


_app = typer.Typer(
    cls=MemctlGroup,
    help="memctl: agent memory on PostgreSQL + pgvector.\n\n"
    "Facts (keyed, editable, with history), episodes (an append-only log searched by meaning "
    "and by words), runbooks (procedures in git, run exactly).",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="markdown",  # paragraphs reflow; [section] names are not taken for markup
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    """memctl's version, the schema it knows, and the database's schema, PostgreSQL and pgvector where it can reach
    them (an embedded server is never started for this)."""
    if not value:
        return
    from memctl import db
    from memctl.upgrade import migrating

    try:
        url = db.resolve(None, common.settings()).url or None
    except MemctlError as exc:
        lines = migrating.version_lines(None)[:2] + [f"database not reached: {exc}"]
    else:
        lines = migrating.version_lines(url)
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    raise typer.Exit()


@_app.callback()
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
        bool,
        typer.Option(
            "--version",
            callback=_version,
            is_eager=True,
            help="Print memctl's version, its schema, and the database's schema, PostgreSQL and "
            "pgvector versions where it can reach them; then exit.",
        ),
    ] = False,
) -> None:
    if database_url is not None:
        from memctl import db

        db.check_url(database_url, "--database-url")
    common.reset().database_url = database_url


# Each noun's module, imported only when that noun runs: start-up time is paid
# per command, not for the whole tool (memctl fact get must start fast).
NOUNS = {
    "export": "transfer",
    "import": "transfer",
    "redact": "redact",
    "db": "db",
    "config": "config",
    "fact": "fact",
    "episode": "episode",
    "embed": "embed",
    "status": "status",
    "prune": "retention",
    "purge": "retention",
    "jobs": "retention",
    "source": "retention",
    "runbook": "runbook",
    "size": "size",
    "reembed": "reembed",
    "recall": "recall",
    "systemd": "systemd",
    "summarize": "summarize",
    "mcp": "mcp",
    "agent": "agent",
    "backup": "backup",
    "restore": "backup",
    "metrics": "metrics",
    "erasure": "erasure",
    "ingest": "ingest",
}
EXTRA = {"embed": ["timing"]}  # modules that add commands to another noun's sub-app
ORDER = [
    "fact",
    "episode",
    "embed",
    "timing",
    "status",
    "retention",
    "summarize",
    "runbook",
    "size",
    "reembed",
    "recall",
    "ingest",
    "redact",
    "transfer",
    "backup",
    "erasure",
    "metrics",
    "db",
    "config",
    "systemd",
    "mcp",
    "agent",
]
_loaded: set[str] = set()


def load(modules=None) -> typer.Typer:
    """Register the given CLI modules (all of them by default) on the app."""
    import importlib

    for name in modules if modules is not None else ORDER:
        if name in _loaded:
            continue
        _loaded.add(name)
        importlib.import_module(f"memctl.cli.{name}").register(_app)
    return _app


def _noun(argv: list[str]) -> str | None:
    """The first word after the global options, if it names a noun."""
    args = iter(argv)
    for arg in args:
        if arg == "--database-url":
            next(args, None)
        elif arg.startswith("-"):
            continue
        else:
            return arg if arg in NOUNS else None
    return None


def __getattr__(name: str):
    """`memctl.cli.app` is the app with every command registered (tests, docs)."""
    if name == "app":
        return load()
    raise AttributeError(name)


def main() -> None:
    interrupts.install()
    noun = _noun(sys.argv[1:])
    load([NOUNS[noun], *EXTRA.get(noun, [])] if noun else None)
    try:
        try:
            _app()
        finally:
            sys.stdout.flush()  # here, where a reader gone is caught, not at exit
    except BrokenPipeError:
        _quiet_stdout()
        sys.exit(0)


def _quiet_stdout() -> None:
    """The reader went away (`memctl episode list | head -1`): like any Unix filter, a quiet exit 0. stdout is
    pointed at /dev/null so that flushing it at exit does not fail again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
