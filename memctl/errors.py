"""One exception family; the CLI maps each class to an exit code."""

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_NOT_FOUND = 4


class MemctlError(Exception):
    """An expected failure: the CLI prints its message on one line and exits."""

    exit_code = EXIT_ERROR


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


class SchemaBehind(MemctlError):
    pass


class Blocked(MemctlError):
    """A write came from a blocked source."""


class UnknownModel(MemctlError):
    """The embedder does not have the model (Ollama answers 404)."""


class EmbedInputRejected(MemctlError):
    """The embedder refused this input (e.g. Ollama 400: input exceeds the context length)."""


class ModelMismatch(MemctlError):
    """The configured model differs from the one the database's vectors were made with."""
