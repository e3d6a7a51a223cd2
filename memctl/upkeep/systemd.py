"""systemd units for the scheduled jobs (embed every 5 minutes; summarize, then prune, daily).

The templates live in the repository's systemd/ directory (packaged as
memctl/systemd_units). Rendering fills in three values; each is checked so that
it cannot break a unit file or smuggle in a directive (newline, whitespace,
% specifiers, $ expansion, quotes).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import sys
from pathlib import Path

import memctl
from memctl.errors import MemctlError, UsageError

SERVICES = ("memctl-embed", "memctl-summarize", "memctl-prune")
UNIT_NAMES = tuple(f"{name}.{kind}" for name in SERVICES for kind in ("service", "timer"))
TIMERS = tuple(f"{name}.timer" for name in SERVICES)
DEFAULT_USER = "memctl"
DEFAULT_ENV_FILE = "/etc/memctl/memctl.env"
DEFAULT_DEST = Path("/etc/systemd/system")
STATE_DIR = "/var/lib/memctl"

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
        raise UsageError(f"{what} {value!r} is not a normalized path (no '.', '..', '//' or trailing '/')")


def validate(bin_path: str, user: str, env_file: str) -> None:
    """Raise UsageError unless all three values are safe to put in a unit file."""
    _check_path("the memctl executable", bin_path)
    if not _USER.fullmatch(user):
        raise UsageError(
            f"user {user!r} is not a valid user name (a letter or _, then letters, digits, _ or -; at most 31)"
        )
    _check_path("the environment file", env_file)


def render_units(bin_path: str, user: str = DEFAULT_USER, env_file: str = DEFAULT_ENV_FILE) -> dict[str, str]:
    """Unit file name -> text, placeholders filled in (one pass, so values are never re-expanded)."""
    validate(bin_path, user, env_file)
    values = {"MEMCTL_BIN": bin_path, "USER": user, "ENV_FILE": env_file}
    directory = templates_dir()
    units = {}
    for name in UNIT_NAMES:
        try:
            template = (directory / name).read_text(encoding="utf-8")
        except OSError as exc:
            raise MemctlError(f"cannot read the unit template {directory / name}: {exc.strerror}") from None
        unknown = set(_PLACEHOLDER.findall(template)) - values.keys()
        if unknown:
            raise MemctlError(f"{directory / name}: unknown placeholder(s) {', '.join(sorted(unknown))}")
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
            raise MemctlError(f"cannot write units to {out_dir}: permission denied (run as root, or choose --dest)")
        return [_write_atomically(out_dir / name, text) for name, text in units.items()]
    except OSError as exc:
        raise MemctlError(f"cannot write units to {out_dir}: {exc.strerror or exc}") from None


def _write_atomically(path: Path, text: str) -> Path:
    from memctl import files

    with files.atomic_write(path, mode=0o644) as handle:  # units hold no secret: systemd reads them as root
        handle.write(text)
    return path


def user_exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


def enable_commands(user: str) -> list[str]:
    """The shell commands that make the written units run (memctl never runs them itself)."""
    commands = []
    if not user_exists(user):
        commands.append(
            f"useradd --system --user-group --home-dir {STATE_DIR} --no-create-home "
            f"--shell /usr/sbin/nologin {user}"
        )
    commands += ["systemctl daemon-reload", f"systemctl enable --now {' '.join(TIMERS)}"]
    return commands


def placement_problems(bin_path: str, user: str) -> list[str]:
    """Why the rendered units would fail on this machine (warnings: they may be meant for another)."""
    problems = []
    hidden = next((d for d in _HIDDEN if bin_path == d or bin_path.startswith(d + "/")), None)
    if hidden:
        problems.append(
            f"{bin_path} is under {hidden}, which the units hide from the job (ProtectHome/PrivateTmp): "
            "install memctl elsewhere, e.g. /opt or /usr/local"
        )
    if not os.access(bin_path, os.X_OK) or not Path(bin_path).is_file():
        problems.append(f"{bin_path} is not an executable file on this machine")
    if user == "root":
        problems.append("the jobs would run as root: a dedicated user is safer")
    return problems
