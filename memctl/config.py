"""Settings: command-line option, then MEMCTL_* environment, then TOML file, then defaults.

What the settings are is memctl.schema (each defined once; re-exported here); this module reads them from the
file and the environment, and shows them. Unknown keys and bad values are collected and reported together,
naming the file and the key.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, overload

from memctl.errors import ConfigError
from memctl.schema import (  # noqa: F401  (the configuration's API: memctl.config.Settings, parse_duration, ...)
    DEFAULT_IMPORTANCE,
    ENV_OVERRIDES,
    FREE_SECTIONS,
    INT_MAX,
    JOB_LOG_MIN,
    MAX_DURATION,
    MAX_DURATION_S,
    RETENTION_DEFAULTS,
    RETENTION_SPECIAL,
    SCHEMA,
    SECTIONS,
    Backup,
    Chunking,
    Database,
    DurationTooLong,
    Embedding,
    Episodes,
    Limits,
    Metrics,
    Recall,
    Redaction,
    Schedule,
    Search,
    Setting,
    Settings,
    Summarize,
    parse_duration,
)


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
                    check = known[key].check
                else:
                    problems.append(f"{path}: [{name}] {key}: unknown key")
                    continue
                try:
                    values.setdefault(name, {})[key] = check(item)
                except ValueError as exc:
                    problems.append(f"{path}: [{name}] {key}: {exc}")
        elif name in SCHEMA[""]:
            try:
                values.setdefault("", {})[name] = SCHEMA[""][name].check(value)
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
        for key in keys:
            settings.origins[(section, key)] = "default"
    for kind in DEFAULT_IMPORTANCE:
        settings.origins[("importance", kind)] = "default"
    if settings.file_exists:
        file_values, problems = _validate(
            _read_file(path, "MEMCTL_CONFIG" if from_env else None), path
        )
        if problems:
            raise ConfigError(
                f"{len(problems)} problem(s) in the configuration:\n  " + "\n  ".join(problems)
            )
        for section, keys in file_values.items():
            for key, value in keys.items():
                settings.assign(section, key, value)
                settings.origins[(section, key)] = "file"
    for (section, key), var in ENV_OVERRIDES.items():
        if env.get(var):
            try:
                settings.assign(section, key, SCHEMA[section][key].check(env[var]))
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
    re.IGNORECASE,
)
# A libpq key=value string: password=secret or password='it''s quoted'.
_KEYWORD_SECRET = re.compile(
    r"(?<![\w?&.-])((?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s'][^\s]*)", re.IGNORECASE
)


@overload
def mask_secrets(text: str) -> str: ...
@overload
def mask_secrets(text: str | None) -> str | None: ...
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


def shown_settings(settings: Settings) -> list[dict[str, Any]]:
    """Rows for `config show`: every setting of the schema and of [importance] and [retention], secrets masked."""
    rows = []
    retention = {**RETENTION_DEFAULTS, **settings.retention}
    given = {
        (section, key): value for section, key, value in settings.items() if section != "retention"
    }
    given.update({("retention", key): value for key, value in retention.items()})
    for (section, key), value in sorted(given.items()):
        if isinstance(value, str):  # every URL or DSN-valued setting, whatever its name
            value = _mask_setting(value)
        name = f"{section}.{key}" if section else key
        origin = settings.origins.get(
            (section, key), "file" if key in settings.retention else "default"
        )
        rows.append({"setting": name, "value": value, "origin": origin})
    return rows


# The reference block of docs/configuration.md, made from the schema (tests/test_docs.py checks the page holds it):
# `python -c 'from memctl import config; print(config.reference())'` prints it. [importance] and [retention] take
# any kind as a key: their lines are these examples.
FREE_EXAMPLES = {
    "importance": (
        "default importance per kind; 0 = not stored at all",
        [
            *((kind, str(value), "") for kind, value in DEFAULT_IMPORTANCE.items()),
            ("default", "5", "kinds not listed"),
        ],
    ),
    "retention": (
        "maximum age per kind; kinds not named are kept",
        [
            ("raw", '"30d"', ""),
            ("summary", '"365d"', ""),
            ("keep_importance", "9", "not a kind: importance >= 9 is kept whatever its age"),
            (
                "jobs",
                f'"{RETENTION_DEFAULTS["jobs"]}"',
                f"not a kind: the job log's age (jobs, runbook runs); at least {JOB_LOG_MIN}",
            ),
            (
                "require_summary",
                "true",
                "with [summarize] model set, prune keeps what no summary holds yet",
            ),
        ],
    ),
}
_COMMENT_AT, _WIDTH = 29, 116


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def _line(text: str, doc: str) -> list[str]:
    """`text`, then `doc` as a comment at column _COMMENT_AT, wrapped to _WIDTH."""
    if not doc:
        return [text]
    import textwrap

    start = max(_COMMENT_AT, len(text) + 2)
    first, *rest = textwrap.wrap(doc, _WIDTH - start - 2) or [""]
    rest = textwrap.wrap(" ".join(rest), _WIDTH - _COMMENT_AT - 2)
    return [text.ljust(start) + "# " + first, *(" " * _COMMENT_AT + "# " + more for more in rest)]


def reference() -> str:
    """Every setting of the schema as a commented TOML file: defaults set, examples of the unset commented out."""
    out: list[str] = []
    sections = [*SCHEMA, *FREE_EXAMPLES]
    for section in sections:
        if section:
            doc = (
                (SECTIONS[section].__doc__ or "").partition(": ")[2]
                if section in SECTIONS
                else FREE_EXAMPLES[section][0]
            )
            out += ["", *_line(f"[{section}]", doc.strip())]
        if section in FREE_EXAMPLES:
            out += [
                line
                for key, value, doc in FREE_EXAMPLES[section][1]
                for line in _line(f"{key} = {value}", doc)
            ]
            continue
        for spec in SCHEMA[section].values():
            doc = spec.doc + (f"; or {spec.env}" if spec.env else "")
            if spec.default is None:
                out += _line(f"# {spec.name} = {spec.example}", doc)
            else:
                out += _line(f"{spec.name} = {_toml(spec.default)}", doc)
    return "\n".join(out).strip("\n") + "\n"
