"""One exception family; the CLI maps each class to an exit code."""

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_NOT_FOUND = 4
EXIT_DISK_FULL = 5
EXIT_SCHEMA_CHANGED = (
    75  # EX_TEMPFAIL: the schema changed under this process; the systemd units restart it
)


class MemctlError(Exception):
    """An expected failure: the CLI prints its message on one line and exits."""

    exit_code = EXIT_ERROR


class NothingToDo(MemctlError):
    """Nothing matched, or nothing to do (no window to summarize): said on stderr, and exit 0, the same everywhere
    (README, exit codes). Not "not found" (4), which is for a thing named by its key, id or name."""

    exit_code = EXIT_OK


class UsageError(MemctlError):
    """The caller asked for something malformed (bad value, bad input line)."""

    exit_code = EXIT_USAGE


class BadValue(UsageError):
    """A value fails its check where it enters (an option, a JSONL field, a setting): exit 2.

    `field` names what was wrong (the option, or the record's field); the message says why.
    """

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class InvalidInput(MemctlError):
    """Data the caller supplied cannot be stored (NUL, empty text, bad JSONL line)."""

    exit_code = EXIT_ERROR


class ConfigError(MemctlError):
    exit_code = EXIT_ERROR


class NotFound(MemctlError):
    exit_code = EXIT_NOT_FOUND


class Unavailable(MemctlError):
    """A dependency (the database or the embedder) cannot be reached."""

    exit_code = EXIT_UNAVAILABLE


class DatabaseUnavailable(Unavailable):
    pass


class EmbedderUnavailable(Unavailable):
    pass


class DiskFull(MemctlError):
    """A disk memctl or its database writes to is full (ENOSPC, SQLSTATE 53100): exit 5.

    Not 3 ("unavailable, retry later"): a full disk does not clear itself. What failed was rolled back
    or removed whole; once space is freed the same command works with no other step. `disk` names it.
    """

    exit_code = EXIT_DISK_FULL

    def __init__(self, disk: str, what: str = ""):
        self.disk = disk
        super().__init__(
            f"disk full: {disk} has no space left{f' ({what})' if what else ''}; nothing was half "
            "written: free space there, then run the command again"
        )

    @classmethod
    def output(cls, path: str) -> "DiskFull":
        """Standard output was a file (the shell's redirect) on the disk that filled: that file is cut short."""
        error = cls.__new__(cls)
        error.disk = f"the disk holding {path}"
        MemctlError.__init__(
            error,
            f"disk full: the disk holding {path} (standard output) has no space left; what "
            f"was written to {path} is cut short (your shell created it, memctl cannot "
            "remove it): free space there, then run the command again",
        )
        return error

    @classmethod
    def at(cls, path, what: str = "") -> "DiskFull":
        """The disk holding PATH, named by the path and the mount point of its filesystem."""
        mount = mount_point(path)
        return cls(
            f"the disk holding {path}" + (f" (the filesystem mounted at {mount})" if mount else ""),
            what,
        )


def mount_point(path) -> str | None:
    """The mount point of the filesystem holding PATH (or its nearest existing parent); None if unknown."""
    import os

    current = os.path.abspath(os.fspath(path))
    while not os.path.exists(current) and current != os.path.dirname(current):
        current = os.path.dirname(current)
    try:
        device = os.stat(current).st_dev
        while (
            current != os.path.dirname(current)
            and os.stat(os.path.dirname(current)).st_dev == device
        ):
            current = os.path.dirname(current)
    except OSError:
        return None
    return current


def causes(exc: BaseException | None):
    """EXC, then what it was raised from or while handling (`raise ... from None` keeps the latter)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def no_space(exc: BaseException) -> bool:
    """An OSError for a full disk or an exhausted quota (ENOSPC, EDQUOT)."""
    import errno

    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


class SchemaBehind(MemctlError):
    pass


class SchemaAhead(MemctlError):
    """The memory's schema holds migrations this memctl does not know: a newer memctl migrated it."""


class SchemaChanged(MemctlError):
    """The memory's schema changed while this process ran (a newer memctl migrated it): exit 75, which the
    systemd units of long-running processes take as a clean stop and restart with the memctl installed now."""

    exit_code = EXIT_SCHEMA_CHANGED


class Blocked(MemctlError):
    """A write came from a blocked source."""


class UnknownModel(MemctlError):
    """The embedder does not have the model (Ollama answers 404)."""


class EmbedInputRejected(MemctlError):
    """The embedder refused this input (e.g. Ollama 400: input exceeds the context length)."""
