"""systemd units: the embedded server (memctl-db.service) and the scheduled jobs (embed every 5 minutes;
backup, summarize, then prune, daily).

The templates live in the repository's systemd/ directory (packaged as
memctl/systemd_units). Rendering fills in the values given (the executable, the
user, the environment file, a metrics textfile, a backup directory); each is
checked so that it cannot break a unit file or smuggle in a directive (newline,
whitespace, % specifiers, $ expansion, quotes). The lines that depend on a
choice (memctl-db.service or not, metrics or not) are written here, not taken
from the caller.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import memctl
from memctl.errors import MemctlError, UsageError

DB_SERVICE = "memctl-db.service"
SERVICES = (
    "memctl-embed",
    "memctl-summarize",
    "memctl-prune",
    "memctl-backup",
)  # the scheduled jobs
INGEST_SERVICE = (
    "memctl-ingest@.service"  # a template: one instance per unit followed (memctl-ingest@nginx)
)
MCP_SERVICE = "memctl-mcp.service"  # agents over streamable HTTP: rendered, enabled by the operator
UNIT_NAMES = (
    DB_SERVICE,
    *(f"{name}.{kind}" for name in SERVICES for kind in ("service", "timer")),
    MCP_SERVICE,
    INGEST_SERVICE,
)
TIMERS = tuple(f"{name}.timer" for name in SERVICES)
DEFAULT_USER = "memctl"
DEFAULT_ENV_FILE = "/etc/memctl/memctl.env"
DEFAULT_DEST = Path("/etc/systemd/system")
STATE_DIR = "/var/lib/memctl"
MOVED_ASIDE = ".before-units"  # the suffix the refusal suggests for a state directory moved aside

_PLACEHOLDER = re.compile(r"@([A-Z_]+)@")
# systemd's strict user name rule (and POSIX-portable): no dots, no leading digit or dash.
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,30}")
# Characters a path may carry into ExecStart= / EnvironmentFile= without quoting.
_PATH = re.compile(r"/[A-Za-z0-9._+,:@=~/-]*")
# Directories the units hide from the job (ProtectHome=yes, PrivateTmp=yes).
_HIDDEN = ("/home", "/root", "/run/user", "/tmp", "/var/tmp")


def templates_dir() -> Path:
    """The unit templates: inside the installed package, or the checkout's systemd/."""
    packaged = Path(memctl.__file__).parent / "systemd_units"
    return packaged if packaged.is_dir() else Path(memctl.__file__).parent.parent / "systemd"


def default_bin() -> str:
    """The running memctl executable, as an absolute path for ExecStart=."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if argv0 is not None and argv0.name == "memctl" and argv0.is_file():
        return os.path.abspath(argv0)
    found = shutil.which("memctl")
    if found:
        return os.path.abspath(found)
    sibling = Path(sys.executable).parent / "memctl"
    if sibling.is_file():
        return str(sibling)
    raise UsageError("cannot find the memctl executable: give its absolute path with --bin")


def _check_path(what: str, value: str) -> None:
    if not value.startswith("/"):
        raise UsageError(f"{what} must be an absolute path, got {value!r}")
    if not _PATH.fullmatch(value):
        raise UsageError(
            f"{what} {value!r} has characters a unit file would misread "
            "(allowed: letters, digits and . _ + , : @ = ~ / -)"
        )
    if os.path.normpath(value) != value:
        raise UsageError(
            f"{what} {value!r} is not a normalized path (no '.', '..', '//' or trailing '/')"
        )


def validate(bin_path: str, user: str, env_file: str) -> None:
    """Raise UsageError unless all three values are safe to put in a unit file."""
    _check_path("the memctl executable", bin_path)
    if not _USER.fullmatch(user):
        raise UsageError(
            f"user {user!r} is not a valid user name (a letter or _, then letters, digits, _ or -; at most 31)"
        )
    _check_path("the environment file", env_file)


def _check_writable_dir(what: str, directory: str) -> None:
    """A directory a job is let write to (ReadWritePaths=): not /, not a whole top-level tree like /etc."""
    if len(Path(directory).parts) < 3:
        raise UsageError(
            f"{what} {directory!r} would open a whole top-level directory to the jobs: "
            "give a directory of its own, e.g. /var/lib/prometheus/node-exporter"
        )


@dataclass
class Extras:
    """What the operator chose besides the three values: memctl-db.service, a metrics textfile, a backup dir."""

    embedded: bool = True
    metrics_textfile: str | None = None
    backup_dir: str | None = None

    def validate(self) -> None:
        if self.metrics_textfile is not None:
            _check_path("the metrics textfile", self.metrics_textfile)
            if not self.metrics_textfile.endswith(".prom"):
                raise UsageError(
                    f"the metrics textfile {self.metrics_textfile!r} must end in .prom "
                    "(node_exporter's textfile collector reads only those)"
                )
            _check_writable_dir(
                "the metrics textfile's directory", os.path.dirname(self.metrics_textfile)
            )
        if self.backup_dir is not None:
            _check_path("[backup] dir", self.backup_dir)
            _check_writable_dir("[backup] dir", self.backup_dir)

    def values(self, bin_path: str) -> dict[str, str]:
        """The placeholders whose lines depend on these choices (empty: nothing rendered)."""
        db = f"Wants={DB_SERVICE}\nAfter={DB_SERVICE}" if self.embedded else ""
        metrics = ""
        if self.metrics_textfile:
            metrics = (
                f"ExecStopPost=-{bin_path} metrics --textfile {self.metrics_textfile}\n"
                f"ReadWritePaths=-{os.path.dirname(self.metrics_textfile)}"
            )
        backup = ""
        if self.backup_dir and not (self.backup_dir + "/").startswith(STATE_DIR + "/"):
            backup = f"ReadWritePaths=-{self.backup_dir}"
        required = f"Requires={DB_SERVICE}\nAfter={DB_SERVICE}" if self.embedded else ""
        return {"DB_UNIT": db, "DB_REQUIRED": required, "METRICS": metrics, "BACKUP_DIR": backup}


def unit_names(embedded: bool = True) -> tuple[str, ...]:
    return UNIT_NAMES if embedded else tuple(name for name in UNIT_NAMES if name != DB_SERVICE)


def render_units(
    bin_path: str,
    user: str = DEFAULT_USER,
    env_file: str = DEFAULT_ENV_FILE,
    extras: Extras | None = None,
) -> dict[str, str]:
    """Unit file name -> text, placeholders filled in (one pass, so values are never re-expanded)."""
    extras = extras or Extras()
    validate(bin_path, user, env_file)
    extras.validate()
    values = {"MEMCTL_BIN": bin_path, "USER": user, "ENV_FILE": env_file, **extras.values(bin_path)}
    directory = templates_dir()
    units = {}
    for name in unit_names(extras.embedded):
        try:
            template = (directory / name).read_text(encoding="utf-8")
        except OSError as exc:
            raise MemctlError(
                f"cannot read the unit template {directory / name}: {exc.strerror}"
            ) from None
        unknown = set(_PLACEHOLDER.findall(template)) - values.keys()
        if unknown:
            raise MemctlError(
                f"{directory / name}: unknown placeholder(s) {', '.join(sorted(unknown))}"
            )
        units[name] = _PLACEHOLDER.sub(lambda match: values[match.group(1)], template)
    return units


def write_units(units: dict[str, str], out_dir: Path, *, create: bool = True) -> list[Path]:
    """Write each unit (mode 0644, replaced atomically) into out_dir; the paths written, in order."""
    out_dir = Path(out_dir)
    try:
        if create:
            out_dir.mkdir(parents=True, exist_ok=True)
        if not out_dir.is_dir():
            raise MemctlError(f"cannot write units to {out_dir}: not a directory")
        if not os.access(out_dir, os.W_OK):
            raise MemctlError(
                f"cannot write units to {out_dir}: permission denied (run as root, or choose --dest)"
            )
        return [_write_atomically(out_dir / name, text) for name, text in units.items()]
    except OSError as exc:
        raise MemctlError(f"cannot write units to {out_dir}: {exc.strerror or exc}") from None


def _write_atomically(path: Path, text: str) -> Path:
    from memctl import files

    with files.atomic_write(
        path, mode=0o644
    ) as handle:  # units hold no secret: systemd reads them as root
        handle.write(text)
    return path


def user_exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


def _useradd(user: str) -> str:
    return (
        f"useradd --system --user-group --home-dir {STATE_DIR} --no-create-home "
        f"--shell /usr/sbin/nologin {user}"
    )


def enable_commands(user: str, embedded: bool = True) -> list[str]:
    """The shell commands that make the written units run (memctl never runs them itself)."""
    commands = [] if user_exists(user) else [_useradd(user)]
    commands.append("systemctl daemon-reload")
    if embedded:
        commands.append(f"systemctl enable --now {DB_SERVICE}")
    commands.append(f"systemctl enable --now {' '.join(TIMERS)}")
    return commands


def foreign_data(state_dir: Path, user: str) -> list[tuple[Path, str]]:
    """(path, owner) of what in the state directory the user does not own, if it holds anything.

    systemd chowns a StateDirectory= whose owner is not User= recursively, silently: a root Quickstart's
    database (owned by embedded_postgres) would change hands under a server still running. Checked: the
    directory itself and its entries (pgdata, the start lock, backups), not every file below them.
    """
    try:
        entries = sorted(state_dir.iterdir())
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise MemctlError(f"cannot read {state_dir}: {exc.strerror}") from None
    if not entries:
        return []
    uid = pwd.getpwnam(user).pw_uid if user_exists(user) else None
    found = []
    for path in [state_dir, *entries]:
        owner = path.lstat().st_uid
        if owner != uid:
            try:
                found.append((path, pwd.getpwuid(owner).pw_name))
            except KeyError:
                found.append((path, str(owner)))
    return found


def takeover_commands(state_dir: Path, user: str) -> list[str]:
    """What the operator runs to keep the data for the units, or to move it aside (shell comments between)."""
    stop = f"MEMCTL_HOME={state_dir} memctl db stop"
    keep = (
        [stop]
        + ([] if user_exists(user) else [_useradd(user)])
        + [f"chown -R {user}:{user} {state_dir}"]
    )
    return (
        [
            "# keep the data: stop the server memctl started as root, give the directory to the units' user"
        ]
        + keep
        + [
            "# or move it aside (memctl-db.service starts an empty database)",
            stop,
            f"mv {state_dir} {state_dir}{MOVED_ASIDE}",
            "# then run memctl systemd install again",
        ]
    )


def _hidden(path: str) -> str | None:
    return next((d for d in _HIDDEN if path == d or path.startswith(d + "/")), None)


def placement_problems(bin_path: str, user: str, extras: Extras | None = None) -> list[str]:
    """Why the rendered units would fail on this machine (warnings: they may be meant for another)."""
    problems = []
    hidden = _hidden(bin_path)
    if hidden:
        problems.append(
            f"{bin_path} is under {hidden}, which the units hide from the job (ProtectHome/PrivateTmp): "
            "install memctl elsewhere, e.g. /opt or /usr/local"
        )
    for what, path in [
        ("the metrics textfile", extras and extras.metrics_textfile),
        ("[backup] dir", extras and extras.backup_dir),
    ]:
        if path and _hidden(path):
            problems.append(
                f"{what} {path} is under {_hidden(path)}, which the units hide from the job"
            )
    if not os.access(bin_path, os.X_OK) or not Path(bin_path).is_file():
        problems.append(f"{bin_path} is not an executable file on this machine")
    if user == "root":
        problems.append(
            "the jobs would run as root, and memctl-db.service cannot: PostgreSQL refuses root"
        )
    return problems


# --- the settings the units read --------------------------------------------------------------------------

DEFAULT_CONFIG = "/etc/memctl/config.toml"


def example_env(config_file: str = DEFAULT_CONFIG) -> str:
    """An example EnvironmentFile= for the units: where their config lives, and the settings usually set."""
    return f"""# memctl.env: settings and secrets for memctl's systemd units (EnvironmentFile=).
# systemd reads it as root before the job drops to its user: root:root 0600 is right.
#
# The units run with HOME=/var/lib/memctl, so a config in an operator's ~/.config/memctl never reaches
# them (a [retention] policy there would never reach the prune timer). They read this file instead,
# which must exist and be readable by the units' user (root:memctl 0640); the operator's shell reads
# the same one with `export MEMCTL_CONFIG={config_file}`.
MEMCTL_CONFIG={config_file}
#
# The database: the embedded one owned by memctl-db.service (nothing to set), or your own server:
#MEMCTL_DATABASE_URL=postgresql://memctl:SECRET@127.0.0.1:5432/memctl
# The embedder: Ollama on this host (the default), or the in-process one (pip install 'memctl[local]'):
#OLLAMA_HOST=http://127.0.0.1:11434
#MEMCTL_EMBED_MODEL=nomic-embed-text
#MEMCTL_EMBEDDER=local
"""


def example_config() -> str:
    return """# memctl's configuration for the systemd units and the operator's shell (MEMCTL_CONFIG names it).
# Every setting: docs/configuration.md. Secrets belong in memctl.env, not here.

[retention]
# conversation = "90d"
# observation = "30d"
jobs = "90d"

[backup]
# keep_daily = 7
# keep_weekly = 4
"""
