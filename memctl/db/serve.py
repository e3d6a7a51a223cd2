"""`memctl db serve`: the embedded server in the foreground, owned by a service (memctl-db.service).

Under systemd a oneshot job must never be the server's parent: when the job ends, systemd stops every
process of its unit, the server included, while an agent may still be connected. So one long-running
unit owns the server and everything else connects to it (DESIGN.md decision 9).

How: this process runs `postgres` as its child, in the foreground, and stays its parent:
- it makes a new data directory first (initdb, then shared_buffers sized as embedded.py sizes it);
- it writes MEMCTL_HOME/managed (socket directory and port) before the server starts, so from then on
  no process sharing the home starts or stops a server of its own (embedded.start/stop);
- it waits for the server to be ready, creates memctl's database if missing, and only then tells systemd
  READY=1 (Type=notify): a job ordered After=memctl-db.service finds the server and its database. The
  wheel's postgres is built without systemd support, so postgres cannot say it itself; and a helper
  forked before exec'ing postgres would become the postmaster's child, whose unknown exit the postmaster
  may take for a crashed backend;
- SIGTERM and SIGINT become SIGINT for postgres, its fast shutdown (clean: a checkpoint, no crash recovery
  at the next start; a "smart" SIGTERM would wait for every agent to disconnect); SIGQUIT and SIGHUP are
  passed on as they are (immediate shutdown, reload). It exits with the server's exit status; 3 when the
  server failed unasked (the unit restarts it), 1 when it refused to start one (the unit does not).

Run by root (an operator trying it by hand, or a test), it stays root itself but runs initdb and postgres
as the owner of MEMCTL_HOME, which must not be root; under the unit it runs as User= and changes nobody.

The socket goes to a directory of its own (the unit's /run/memctl-db, 0750) with permissions 0770, in
the server user's own group: members of that group (the operator, agents) connect, everyone else is
refused; the data directory stays 0700. Not unix_socket_group: that chown(2)s the socket, which the
unit's system call filter refuses (~@privileged holds @chown), and the user's group is the one wanted.
Authentication is `trust`, so the group is the access control. Logs go to stderr (the journal).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from memctl.db import embedded
from memctl.errors import (
    EXIT_UNAVAILABLE,
    ConfigError,
    DatabaseUnavailable,
    MemctlError,
    UsageError,
)

DEFAULT_PORT = 5432
SOCKET_PERMISSIONS = "0770"
SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with the terminating NUL
# SIGTERM would be postgres's "smart" shutdown, which waits for every client (a connected agent) to leave.
FORWARD = {
    signal.SIGTERM: signal.SIGINT,
    signal.SIGINT: signal.SIGINT,
    signal.SIGQUIT: signal.SIGQUIT,
    signal.SIGHUP: signal.SIGHUP,
}
INITDB_ARGS = [
    "--auth=trust",
    "--auth-local=trust",
    "--encoding=utf8",
    "-U",
    "postgres",
]  # as the wheel runs it


def serve(
    socket_dir: Path | None = None,
    port: int = DEFAULT_PORT,
    report: Callable[[str], None] | None = None,
) -> int:
    """Run the embedded server until it is told to stop; its exit status. `socket_dir`: MEMCTL_HOME/run."""
    say = report or (lambda _line: None)
    socket_dir = Path(socket_dir) if socket_dir else embedded.memctl_home() / "run"
    check_socket(socket_dir, port)
    pgdata = embedded.pgdata_dir()
    user = ServerUser.for_home(embedded.memctl_home())
    forwarder = _Forwarder()
    with forwarder.installed():
        with embedded.start_lock():
            user.own(
                embedded.memctl_home() / embedded.START_LOCK
            )  # as root: the units' user may take it later
            proc = _start(pgdata, socket_dir, port, user, forwarder, say)
            if proc is None:
                return 0
            try:
                if _wait_ready(proc, pgdata, forwarder):
                    embedded.ensure_database(embedded.status())
            except MemctlError:
                proc.send_signal(signal.SIGINT)  # no server left behind without its parent
                code = _status(proc.wait())
                if forwarder.stopping:
                    return code
                raise
            if forwarder.stopping:
                return _status(proc.wait())
        _notify("READY=1")
        say(f"embedded database ready: socket {socket_dir}, port {port}, data {pgdata}")
        code = _status(proc.wait())
    if not forwarder.stopping:  # nobody asked: a crash, or a stop behind this process's back
        say(f"postgres exited by itself (exit status {code})")
        return EXIT_UNAVAILABLE if code else 0
    say(f"embedded database stopped (exit status {code})")
    return code


def check_socket(socket_dir: Path, port: int) -> None:
    """Refuse values postgres would misread (a list separator in the directory) or cannot bind."""
    text = str(socket_dir)
    if (
        not socket_dir.is_absolute()
        or any(c in text for c in ",'\"\\")
        or any(c.isspace() for c in text)
    ):
        raise UsageError(
            f"--socket-dir {text!r} must be an absolute path without commas, quotes or spaces"
        )
    if len(f"{text}/.s.PGSQL.{port}") > SOCKET_PATH_MAX:
        raise UsageError(
            f"--socket-dir {text!r} is too long for a Unix socket ({SOCKET_PATH_MAX} bytes at most)"
        )
    if not 1 <= port <= 65535:
        raise UsageError(f"--port {port} is not a port number")


@dataclass
class ServerUser:
    """Who runs initdb and postgres: this process's user, or, when this process is root, the home's owner."""

    uid: int
    gid: int
    name: str
    switch: bool  # True when this process is root and runs its children as uid

    @classmethod
    def for_home(cls, home: Path) -> "ServerUser":
        import pwd

        if not embedded.is_root():
            return cls(os.geteuid(), os.getegid(), _user_name(os.geteuid()), False)
        try:
            owner = home.stat().st_uid
        except OSError:
            owner = 0
        if owner == 0:
            raise ConfigError(
                f"as root, memctl db serve runs the server as the owner of {home}, and that is not a "
                "user (PostgreSQL refuses root): install -d -o memctl -g memctl -m 0750 "
                f"{home}, or run it as that user (sudo -u memctl memctl db serve)"
            )
        try:
            entry = pwd.getpwuid(owner)
        except KeyError:
            raise ConfigError(f"{home} belongs to uid {owner}, which has no user entry") from None
        return cls(owner, entry.pw_gid, entry.pw_name, True)

    def run_kwargs(self) -> dict:
        if not self.switch:
            return {}
        return {
            "user": self.uid,
            "group": self.gid,
            "extra_groups": os.getgrouplist(self.name, self.gid),
            "cwd": "/",
        }  # not root's working directory, which the user may not enter

    def own(self, path: Path) -> None:
        if self.switch:
            os.chown(path, self.uid, self.gid)


def _user_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _start(
    pgdata: Path,
    socket_dir: Path,
    port: int,
    user: ServerUser,
    forwarder: "_Forwarder",
    say: Callable[[str], None],
) -> subprocess.Popen | None:
    """Under the start lock: the data directory checked or made, the home marked managed, postgres started."""
    _refuse_foreign(pgdata, user)
    other = _postmaster_pid(pgdata)
    if other is not None:
        raise MemctlError(
            f"a server started outside memctl db serve runs on {pgdata} (pid {other}): "
            f"stop it first (kill -INT {other})"
        )
    embedded.check_major(pgdata)
    if not (pgdata / "PG_VERSION").exists():
        _initdb(pgdata, user)
        say(f"created the embedded database's data directory {pgdata}")
    try:
        if not socket_dir.is_dir():
            socket_dir.mkdir(mode=0o750, parents=True)
            user.own(socket_dir)
    except OSError as exc:
        raise DatabaseUnavailable(
            f"cannot create the socket directory {socket_dir}: {exc.strerror}"
        ) from None
    marker = embedded.write_managed(embedded.Managed(socket_dir, port))
    user.own(marker)
    say(
        f"{marker} written: memctl processes sharing {marker.parent} connect to this server and never start one"
    )
    if forwarder.stopping:
        return None
    options = {
        "unix_socket_directories": str(socket_dir),
        "unix_socket_permissions": SOCKET_PERMISSIONS,
        "listen_addresses": "",
        "port": str(port),
    }
    argv = [str(embedded.bin_dir() / "postgres"), "-D", str(pgdata)]
    for name, value in options.items():
        argv += ["-c", f"{name}={value}"]
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=env, **user.run_kwargs())
    forwarder.proc = proc
    return proc


def _refuse_foreign(pgdata: Path, user: ServerUser) -> None:
    """A data directory of another user (a root Quickstart's, owned by embedded_postgres) is not taken over."""
    try:
        owner = pgdata.stat().st_uid
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(f"cannot use {pgdata}: {exc.strerror}") from None
    if owner != user.uid:
        raise ConfigError(
            f"{pgdata} belongs to {_user_name(owner)}, not {user.name} (made by memctl as root?): "
            f"stop its server (memctl db stop, as root), then chown -R {user.name}: {pgdata.parent}, "
            "or move it aside; see docs/systemd.md"
        )


def _postmaster_pid(pgdata: Path) -> int | None:
    """The pid of a live postgres on this data directory (postmaster.pid's pid, if that is a postgres)."""
    pid = embedded.read_postmaster(pgdata).pid
    if pid is None or pid in (os.getpid(), os.getppid()):
        return None
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return pid  # not ours to inspect (another user's): assume the file tells the truth
    return (
        pid if comm == "postgres" else None
    )  # a stale file whose pid was reused: postgres replaces it


def _initdb(pgdata: Path, user: ServerUser) -> None:
    try:
        if not pgdata.is_dir():
            pgdata.mkdir(mode=0o700)
            user.own(pgdata)
        subprocess.run(
            [str(embedded.bin_dir() / "initdb"), "-D", str(pgdata), *INITDB_ARGS],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
            **user.run_kwargs(),
        )
    except OSError as exc:
        raise DatabaseUnavailable(f"cannot create {pgdata}: {exc.strerror}") from None
    except subprocess.CalledProcessError as exc:
        last = ((exc.stderr or "").strip().splitlines() or ["no output"])[-1]
        raise DatabaseUnavailable(f"initdb failed for {pgdata}: {last}") from None
    embedded.size_memory(pgdata)


def _wait_ready(proc: subprocess.Popen, pgdata: Path, forwarder: "_Forwarder") -> bool:
    """True once the server accepts connections; False if it was told to stop first."""
    while not embedded.read_postmaster(pgdata).running:
        if proc.poll() is not None:
            if forwarder.stopping:
                return False
            raise DatabaseUnavailable(
                f"postgres exited with status {_status(proc.returncode)} while starting; "
                "its log is above (journalctl -u memctl-db.service)"
            )
        time.sleep(0.05)
    return True


def _status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _notify(state: str) -> None:
    """sd_notify(3) without libsystemd: one datagram to $NOTIFY_SOCKET, if systemd gave one."""
    import socket

    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.connect(address)
        sock.sendall(state.encode())


class _Forwarder:
    """Passes the stop signals on to postgres (see FORWARD); remembers that a stop was asked."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.stopping = False

    def _handle(self, signum, _frame) -> None:
        if signum != signal.SIGHUP and not self.stopping:
            self.stopping = True
            _notify("STOPPING=1")
        if self.proc is not None:  # send_signal skips a child already reaped
            self.proc.send_signal(FORWARD[signal.Signals(signum)])

    def installed(self):
        import contextlib

        @contextlib.contextmanager
        def handlers():
            previous = {sig: signal.signal(sig, self._handle) for sig in FORWARD}
            try:
                yield self
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

        return handlers()
