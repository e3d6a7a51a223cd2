"""Secrets never enter memory: find them in a text and replace each with `[REDACTED:<kind>]`.

This module is the API: the mode (redact, block, off), the markers, `redact_text`, and the one walk
over JSON-like values (`redact_value`). detect.py finds secrets (detect-secrets' regex plugins and
memctl's own detectors, each behind a cheap gate), names.py judges names and values (a secret's
name, a placeholder), shapes.py holds the pairs and headers, prose.py the secrets named in prose,
commands.py the passwords on command lines, providers.py the provider key prefixes. Every detector
runs in time linear in the text (tests/test_redact_shapes.py; tests/bench/redact.py the rates).

What is found and what stays, and why: docs/secrets-and-export.md.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, overload

from memctl.errors import InvalidInput
from memctl.redact.detect import find
from memctl.redact.names import MARKER, Finding, placeholder, secret_name

__all__ = [
    "MODES",
    "DEFAULT_MODE",
    "MARKER",
    "NAMED",
    "Finding",
    "find",
    "replace",
    "redact_text",
    "redact_named",
    "redact_value",
    "secret_name",
    "SecretRefused",
    "kinds_text",
    "Redactor",
]

MODES = ("redact", "block", "off")
DEFAULT_MODE = "redact"


def replace(text: str, found: list[Finding]) -> str:
    out, at = [], 0
    for item in found:
        out.append(text[at : item.start])
        out.append(MARKER.format(item.kind))
        at = item.end
    out.append(text[at:])
    return "".join(out)


def redact_text(text: str | None) -> str | None:
    """The text with every secret replaced by its marker (for logs: always on, whatever the mode)."""
    if not text:
        return text
    found = find(text)
    return replace(text, found) if found else text


NAMED = "secret-named"
# A value with a space and one of these reads as a sentence about the secret ("rotated, see the vault"),
# not as a passphrase, and is scanned like any text.
_PROSE_WORDS = {
    "the",
    "a",
    "an",
    "see",
    "in",
    "is",
    "was",
    "on",
    "at",
    "of",
    "to",
    "from",
    "for",
    "and",
    "or",
    "via",
    "use",
    "used",
    "stored",
    "rotated",
    "moved",
    "ask",
    "set",
    "not",
    "no",
    "by",
    "with",
}


def _named_secret(name: str, value: str) -> bool:
    """Is this value, under this name, a secret to replace whole? Not a placeholder, not a sentence."""
    if not secret_name(name) or placeholder(value, name):
        return False
    words = set(re.findall(r"[a-z]+", value.lower())) if re.search(r"\s", value.strip()) else set()
    return not words & _PROSE_WORDS


def _whole(value: str) -> tuple[str, Counter]:
    """A secret-named value replaced whole: by its own kind's marker when it is one secret a detector knows
    (a GitHub token under deploy.token), else by `[REDACTED:secret-named]`."""
    found = find(value)
    if (
        len(found) == 1
        and not value[: found[0].start].strip()
        and not value[found[0].end :].strip()
    ):
        return MARKER.format(found[0].kind), Counter({found[0].kind: 1})
    return MARKER.format(NAMED), Counter({NAMED: 1})


def redact_named(
    name: str, value: str | None, text: Callable[[str], str | None] | None = None
) -> str | None:
    """A value stored under a name: replaced whole (`_whole`) when the name names a secret (`secret_name`) and
    the value is neither a placeholder nor a sentence, else passed through `text` (default redact_text)."""
    if not value:
        return value
    if _named_secret(name, value):
        return _whole(value)[0]
    return (text or redact_text)(value)


def redact_value(
    value: Any,
    text: Callable[[str], str | None] | None = None,
    named: Callable[[str, str], str | None] | None = None,
) -> Any:
    """Every string in a JSON-like value redacted, structure kept (tuples become lists). The one walk.

    A string that is a mapping's value goes through `named(key, string)` (default: `redact_named` with
    `text`), any other through `text(string)` (default: `redact_text`). Keys are kept as they are.
    """
    clean = text or redact_text
    by_name = named or (lambda key, item: redact_named(key, item, clean))

    def walk(item: Any, key: str | None) -> Any:
        if isinstance(item, str):
            return clean(item) if key is None else by_name(key, item)
        if isinstance(item, dict):
            return {k: walk(v, str(k)) for k, v in item.items()}
        if isinstance(item, (list, tuple)):
            return [walk(v, key) for v in item]
        return item

    return walk(value, None)


class SecretRefused(InvalidInput):
    """[redaction] mode = "block" and the write holds a secret: exit 1, naming its kind, never the value."""


def kinds_text(kinds: Counter) -> str:
    return ", ".join(f"{k} x{n}" if n > 1 else k for k, n in sorted(kinds.items()))


CLEAN_CHARS = 200
CLEAN_SIZE = 4096


@dataclass
class Redactor:
    """Applies the mode to every text of one write (or one import) and counts what it replaced."""

    mode: str = DEFAULT_MODE
    kinds: Counter = field(default_factory=Counter)
    # Short texts found to hold no secret, so an import's agent, kind and source names, the same on thousands
    # of records, are searched once (`find` depends on the text alone). Bounded: at most CLEAN_SIZE of them,
    # none longer than CLEAN_CHARS.
    _clean: set = field(default_factory=set, repr=False, compare=False)

    @classmethod
    def from_settings(cls, settings) -> "Redactor":
        return cls(settings.redaction.mode)

    @property
    def count(self) -> int:
        return sum(self.kinds.values())

    @overload
    def text(self, value: str, what: str = ...) -> str: ...
    @overload
    def text(self, value: str | None, what: str = ...) -> str | None: ...
    def text(self, value: str | None, what: str = "text") -> str | None:
        if self.mode == "off" or not value or value in self._clean:
            return value
        found = find(value)
        if not found:
            if len(value) <= CLEAN_CHARS:
                if len(self._clean) >= CLEAN_SIZE:
                    self._clean.clear()
                self._clean.add(value)
            return value
        kinds = Counter(f.kind for f in found)
        self._allow(what, kinds)
        self.kinds.update(kinds)
        return replace(value, found)

    @overload
    def named(self, name: str, value: str, what: str = ...) -> str: ...
    @overload
    def named(self, name: str, value: str | None, what: str = ...) -> str | None: ...
    def named(self, name: str, value: str | None, what: str = "text") -> str | None:
        """A value stored under a name (a fact's key, a meta field): replaced whole when the name names a
        secret (`secret_name`) and the value is neither a placeholder nor a sentence, by `[REDACTED:<kind>]`
        when the value is one secret a detector knows, else by `[REDACTED:secret-named]`; otherwise as
        `text()`. Block mode refuses it as `text()` does."""
        if self.mode == "off" or not value:
            return value
        if not _named_secret(name, value):
            return self.text(value, what)
        replaced, kinds = _whole(value)
        self._allow(what, kinds)
        self.kinds.update(kinds)
        return replaced

    def value(self, value: Any, what: str = "meta") -> Any:
        """Every string of a JSON-like value through `text()`, a mapping's values through `named()`."""
        return redact_value(
            value, lambda item: self.text(item, what), lambda key, item: self.named(key, item, what)
        )

    def _allow(self, what: str, kinds: Counter) -> None:
        if self.mode == "block":
            raise SecretRefused(
                f"refused: the {what} holds {sum(kinds.values())} secret(s) ({kinds_text(kinds)}); "
                '[redaction] mode = "block" refuses such writes: remove the secret, or set '
                'mode = "redact" to store it as a [REDACTED:<kind>] marker'
            )

    @classmethod
    def configured(cls) -> "Redactor":
        """For library calls that are given no settings (facts): the configured mode, as the CLI would load it."""
        from memctl import config

        return cls.from_settings(config.load())

    def note(self) -> str | None:
        """What the CLI says on stderr after a write that redacted something: count and kinds, never a value."""
        if not self.count:
            return None
        return (
            f"redacted {self.count} secret(s) before storing ({kinds_text(self.kinds)}); "
            "the stored text holds [REDACTED:<kind>] markers instead"
        )
