"""Files that hold memory or credentials: private from the first byte, whole or not at all.

`atomic_write` creates a temporary file beside the target with the final mode given to
open(2) (O_CREAT | O_EXCL, so the file is never readable by others, not even for a moment,
and never chmod-ed after), writes it, fsyncs it, renames it over the target and fsyncs the
directory, so a crash leaves the old file or the new one, never half of one. Used by
`memctl export --out`, `metrics --textfile`, backups, `config pg-service` (service and password files)
and the systemd units.

It writes only a regular file it creates or replaces (`regular_target`): a symlink, a FIFO, a device or a
directory at the path is refused (BadValue, exit 2) and left as it was, looked at before the write and
again just before the rename (a rename replaces whatever is there: run as root it would put the export
in place of /dev/full).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path
from typing import IO, Iterator

from memctl.errors import BadValue, MemctlError

PRIVATE = 0o600


@contextlib.contextmanager
def atomic_write(path: str | Path, *, mode: int = PRIVATE, text: bool = True) -> Iterator[IO]:
    """Write PATH atomically with permissions `mode` (0600 by default); yields the open file."""
    path = regular_target(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    flags = (
        os.O_WRONLY
        | os.O_CREAT
        | os.O_EXCL
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_CLOEXEC", 0)
    )
    fd = os.open(tmp, flags, mode)
    if (
        mode & 0o077
    ):  # a public file (a unit): the mode asked for, whatever the umask; never for a private one
        os.fchmod(fd, mode)
    try:
        with os.fdopen(fd, "w" if text else "wb", encoding="utf-8" if text else None) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        regular_target(path)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


_NOT_REGULAR = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def regular_target(path: str | Path, option: str | None = None) -> Path:
    """PATH, refused (BadValue, exit 2; `option` names it) when something other than a regular file is there."""
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError:
        return path  # unreadable: the write fails and says why
    for test, what in _NOT_REGULAR:
        if test(mode):
            named = f"{option} " if option else ""
            raise BadValue(
                f"{named}{str(path)!r} is {what}: memctl writes only a regular file, created or replaced "
                "whole, never through a link, a device or a FIFO; it was left untouched",
                option,
            )
    return path


def fsync_dir(directory: Path) -> None:
    """Make a rename in DIRECTORY durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text(path: str | Path, text: str, *, mode: int = PRIVATE) -> Path:
    try:
        with atomic_write(path, mode=mode) as handle:
            handle.write(text)
    except OSError as exc:
        raise MemctlError(f"cannot write {path}: {exc.strerror or exc}") from None
    return Path(path)
