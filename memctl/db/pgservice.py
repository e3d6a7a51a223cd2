"""The database connection as libpq files, for shell steps: no DSN on a command line.

`ps` shows every process's arguments to every user, so a runbook must not run
`psql -d "$url"`. libpq does not expand a URI given in PGDATABASE (it is taken
as a database name), but it reads a service file named by PGSERVICEFILE and
PGSERVICE, and a password file named by its `passfile` keyword. So the
connection goes into a service file and its password into a passfile, both
mode 0600 in a directory the caller creates and removes; only their paths
travel, as environment variables.

Precedence stays that of the URL: service-file values beat PG* variables, and
parameters the connection string leaves out still come from them.
"""

from __future__ import annotations

from pathlib import Path

from memctl.errors import ConfigError

SERVICE = "memctl"
SERVICE_FILE = "pg_service.conf"
PASS_FILE = "pgpass"


def _parse(conninfo: str) -> dict[str, str]:
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    from memctl.config import mask_secrets

    try:
        params = conninfo_to_dict(conninfo)
    except ProgrammingError as exc:
        raise ConfigError(
            f"the database URL is not a valid connection string: {mask_secrets(str(exc))}"
        ) from None
    return {key: str(value) for key, value in params.items()}


def _write_private(path: Path, text: str) -> None:
    """Create or replace PATH readable by its owner only (mode 0600 from the first byte), atomically."""
    from memctl import files

    files.write_text(path, text)


def _passfile_line(password: str) -> str:
    if "\n" in password or "\r" in password:
        raise ConfigError(
            "the database password contains a line break, which a libpq password file cannot hold"
        )
    escaped = password.replace("\\", "\\\\").replace(":", "\\:")
    return f"*:*:*:*:{escaped}\n"


def _service_text(params: dict[str, str]) -> str:
    lines = [f"[{SERVICE}]"]
    for key, value in params.items():
        if value != value.strip() or "\n" in value or "\r" in value:
            raise ConfigError(
                f"the database URL's {key!r} has leading or trailing spaces or a line break, "
                "which a libpq service file cannot hold"
            )
        lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


def write(conninfo: str, directory: str | Path) -> dict[str, str]:
    """Write CONNINFO (a URL or key=value string) as a service file, its password as a passfile.

    Returns the environment variables that select them: PGSERVICEFILE and PGSERVICE.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError(f"{directory}: not a directory (create it first, e.g. with mktemp -d)")
    params = _parse(conninfo)
    if "service" in params:
        raise ConfigError(
            f"the database URL names the libpq service {params['service']!r}; libpq cannot nest "
            "services: give the steps PGSERVICE instead of a URL"
        )
    password = params.pop("password", None)
    if password is not None:
        passfile = directory.resolve() / PASS_FILE
        _write_private(passfile, _passfile_line(password))
        params["passfile"] = str(passfile)
    service_file = directory.resolve() / SERVICE_FILE
    _write_private(service_file, _service_text(params))
    return {"PGSERVICEFILE": str(service_file), "PGSERVICE": SERVICE}
