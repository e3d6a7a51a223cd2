"""Secrets never enter memory: find them in a text and replace each with `[REDACTED:<kind>]`.

Detection is detect-secrets' regex plugins (GitHub, AWS, Slack, Stripe, JWT, private key
headers, quoted `password = "..."` keywords, ...) plus what they miss that matters here:
credentials inside URLs (the same rules as config.mask_secrets) and whole PEM/OpenSSH
private key blocks (detect-secrets flags only the BEGIN line). Left out on purpose, because
operators write these every day and memory full of markers is broken memory: the
high-entropy plugins (they fire on commit ids, sha256 sums and UUIDs), the public-IP
plugin, and Basic Auth (replaced by the URL rule, which also masks the password of a URL
whose password holds reserved characters). tests/data/secrets_labelled.jsonl proves both
sides.

Each plugin's own analyze_string runs once over the whole text (the keyword plugin per
line), so its validity checks apply (a JWT must decode); the values it reports are then
located in the text. A text with no run of 16 token characters, no `://`, no
`password=`, no `=`/`:` before a quote and no PRIVATE KEY line skips every plugin (one
cheap search), which is most prose.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

from memctl.errors import InvalidInput

MODES = ("redact", "block", "off")
DEFAULT_MODE = "redact"
MARKER = "[REDACTED:{}]"
_MARKER = re.compile(r"\[REDACTED:[a-z0-9-]+\]")

# detect-secrets plugins not used (see the module docstring).
EXCLUDED_PLUGINS = {"Base64HighEntropyString", "HexHighEntropyString", "IPPublicDetector", "BasicAuthDetector"}
KIND_NAMES = {"AWS Access Key": "aws-access-key", "Secret Keyword": "secret-keyword", "Private Key": "private-key"}

# A PEM or OpenSSH private key, BEGIN to END (or, cut off, to the end of its base64 lines).
_PRIVATE_KEY = re.compile(
    r"-----BEGIN ((?:[A-Z0-9]+ )*)PRIVATE KEY(?: BLOCK)?-----"
    r"(?:.*?-----END \1PRIVATE KEY(?: BLOCK)?-----|(?:[ \t]*\r?\n[ \t]*[A-Za-z0-9+/=:-][^\n]*)*)",
    re.DOTALL)
# scheme://user:password@host: the password runs to the last @ of the token, as in config.mask_secrets.
_URL_PASSWORD = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@?#]*:([^\s]+)@")
# ?password=... / ?token=... in a URL's query string, and a libpq password=... pair.
_QUERY_SECRET = re.compile(
    r"[?&](?:(?:ssl)?(?:password|passwd|pwd)|token|api[_-]?key|access[_-]?token|secret)=([^&#\s'\"]+)", re.IGNORECASE)
_KEYWORD_PASSWORD = re.compile(r"(?<![\w?&.-])(?:ssl)?password\s*=\s*('(?:[^'\\]|\\.)*'|[^\s'\"][^\s]*)",
                               re.IGNORECASE)
# Per plugin, a cheap test that every match of its patterns implies (a keyword, a prefix, a
# quote), on the text and its lower-case copy: a plugin whose gate fails is not run. Plain
# substring tests, because Python's re is slow on case-insensitive alternations (measured:
# 30-40 us per 300-character line for each such gate as a regex; the keyword plugin itself
# costs 230 us).
_QUOTED = re.compile(r"['\"`]")


def _any(*words: str):
    return lambda text, low: any(w in low for w in words)


GATES = {
    "secret-keyword": lambda text, low: _QUOTED.search(text) is not None,
    "cloudant-credentials": _any("key", "pw", "pass", "token", "cloudant"),
    "softlayer-credentials": _any("key", "pw", "pass", "token"),
    "ibm-cloud-iam-key": _any("key", "pw", "pass", "token"),
    "ibm-cos-hmac-credentials": _any("secret"),
    "artifactory-credentials": lambda text, low: "AKC" in text or "AP" in text,
    "mailchimp-access-key": _any("-us"),
    "aws-access-key": lambda text, low: "aws" in low or "A3T" in text or "IA" in text or "ACCA" in text,
    "slack-token": _any("xox", "hooks.slack.com"),
    "json-web-token": lambda text, low: "eyJ" in text,
    "private-key": _any("private key", "putty"),
    "npm-tokens": _any("_authtoken"),
    "pypi-token": _any("pypi-"),
    "sendgrid-api-key": lambda text, low: "SG." in text,
    "stripe-access-key": _any("k_live_"),
}


# A commit id, a sha256 sum, a UUID, a trace id: hex with separators. No plugin used here matches
# one unless a keyword (key, token, secret, ...) is near, so such a token alone is no reason to run them.
_HEXISH = re.compile(r"[(\[\"'`]*(?:sha\d{1,3}[:=-])?[0-9a-fA-F][0-9a-fA-F:.\-]*[)\]\"'`,.;:]*")
_KEYWORDS = _any("key", "pw", "pass", "token", "secret", "cloudant", "auth")


def _candidate(text: str, low: str) -> bool:
    """Could any detector match at all? A long token, a URL, a key line, a password pair or a quote."""
    if "://" in text or "private key" in low or "putty" in low or "password" in low or _QUOTED.search(text):
        return True
    tokens = text.split()
    if max(map(len, tokens), default=0) < 16:
        return False
    long = [t for t in tokens if len(t) >= 16]
    if "[REDACTED:" in text:
        long = [t for t in long if len(_MARKER.sub("", t)) >= 16]
    plain = [t for t in long if not _HEXISH.fullmatch(t)]
    return bool(plain) or (bool(long) and _KEYWORDS(text, low))


# A value that is already masked or a placeholder is not a secret.
_NOT_A_SECRET = re.compile(r"^(?:\*+|\[REDACTED:[a-z0-9-]+\]|\$\{?\w+\}?|<[^>]*>|%\(?\w*\)?s?|x+|X+)$")


@dataclass(frozen=True)
class Finding:
    kind: str
    start: int
    end: int


@lru_cache(maxsize=1)
def _plugins() -> tuple[tuple[str, Any], ...]:
    """(kind, plugin instance) for every detect-secrets plugin used."""
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class

    plugins = []
    for secret_type, plugin in sorted(get_mapping_from_secret_type_to_class().items()):
        if plugin.__name__ in EXCLUDED_PLUGINS:
            continue
        kind = KIND_NAMES.get(secret_type) or re.sub(r"[^a-z0-9]+", "-", secret_type.lower()).strip("-")
        plugins.append((kind, plugin()))
    return tuple(plugins)


def _occurrences(text: str, value: str, kind: str) -> list[Finding]:
    """Where a value a plugin reported sits in the text; a short one only as a whole word."""
    value = value.strip(" \t\r\n\"'`")
    if len(value) < 4:
        return []
    if len(value) < 12:
        pattern = re.compile(r"(?<![\w-])" + re.escape(value) + r"(?![\w-])")
        return [Finding(kind, *m.span()) for m in pattern.finditer(text)]
    found, at = [], text.find(value)
    while at >= 0:
        found.append(Finding(kind, at, at + len(value)))
        at = text.find(value, at + len(value))
    return found


def _regex_findings(text: str, kind: str, plugin) -> list[Finding]:
    """A plain regex plugin's matches as spans: its capture group when that is the secret, else the whole match.

    (Its analyze_string reports a group's text, for the GitHub pattern the bare "ghp" prefix.)
    """
    found = []
    for regex in plugin.denylist:
        for match in regex.finditer(text):
            start, end = match.span()
            for index in range(1, regex.groups + 1):
                if match.group(index) and len(match.group(index)) >= 8:
                    start, end = match.span(index)
                    break
            piece = text[start:end]
            start += len(piece) - len(piece.lstrip(" \t\r\n=:\"'"))
            end -= len(piece) - len(piece.rstrip(" \t\r\n\"'"))
            if end > start:
                found.append(Finding(kind, start, end))
    return found


_TOKEN_TAIL = re.compile(r"[A-Za-z0-9_\-+/=.]*")


def _extend_token(text: str, finding: Finding) -> Finding:
    """A JWT runs on to its signature, which the plugin's lazy pattern leaves out."""
    return Finding(finding.kind, finding.start, _TOKEN_TAIL.match(text, finding.end).end())


def _plugin_findings(text: str, low: str) -> list[Finding]:
    from detect_secrets.plugins.base import RegexBasedDetector

    found: list[Finding] = []
    for kind, plugin in _plugins():
        gate = GATES.get(kind)
        if gate is not None and not gate(text, low):
            continue
        if isinstance(plugin, RegexBasedDetector) and type(plugin).analyze_string is RegexBasedDetector.analyze_string:
            found.extend(_regex_findings(text, kind, plugin))
            continue
        # The keyword plugin reports one value per pattern per call: give it one line at a time.
        pieces = text.splitlines() if kind == "secret-keyword" else [text]
        for piece in pieces:
            if gate is not None and not gate(piece, piece.lower()):
                continue
            for value in set(plugin.analyze_string(piece)):
                found.extend(_extend_token(text, f) if kind == "json-web-token" else f
                             for f in _occurrences(text, value, kind))
    return found


def find(text: str) -> list[Finding]:
    """Every secret in the text, as non-overlapping spans in order (the longest wins an overlap)."""
    if not text:
        return []
    low = text.lower()
    if not _candidate(text, low):
        return []
    found: list[Finding] = []
    if "private key" in low:
        found.extend(Finding("private-key", *m.span()) for m in _PRIVATE_KEY.finditer(text))
    if "://" in text:
        found.extend(Finding("url-password", *m.span(1)) for m in _URL_PASSWORD.finditer(text))
    if "=" in text:
        found.extend(Finding("url-secret", *m.span(1)) for m in _QUERY_SECRET.finditer(text))
        if "password" in low:
            found.extend(Finding("password", *m.span(1)) for m in _KEYWORD_PASSWORD.finditer(text))
    found.extend(_plugin_findings(text, low))
    if not found:
        return []
    return _merge([f for f in found if not _NOT_A_SECRET.match(text[f.start:f.end]) and not _in_marker(text, f)])


def _in_marker(text: str, finding: Finding) -> bool:
    return any(m.start() <= finding.start and finding.end <= m.end() for m in _MARKER.finditer(text))


def _merge(found: list[Finding]) -> list[Finding]:
    kept: list[Finding] = []
    for item in sorted(found, key=lambda f: (f.start, -(f.end - f.start))):
        if kept and item.start < kept[-1].end:
            if item.end > kept[-1].end:
                kept[-1] = Finding(kept[-1].kind, kept[-1].start, item.end)
            continue
        kept.append(item)
    return kept


def replace(text: str, found: list[Finding]) -> str:
    out, at = [], 0
    for item in found:
        out.append(text[at:item.start])
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


def redact_value(value: Any, text: Callable[[str], str | None] | None = None) -> Any:
    """Every string in a JSON-like value redacted (or passed through `text`), structure kept."""
    clean = text or redact_text
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {k: redact_value(v, clean) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(v, clean) for v in value]
    return value


class SecretRefused(InvalidInput):
    """[redaction] mode = "block" and the write holds a secret: exit 1, naming its kind, never the value."""


def kinds_text(kinds: Counter) -> str:
    return ", ".join(f"{k} x{n}" if n > 1 else k for k, n in sorted(kinds.items()))


@dataclass
class Redactor:
    """Applies the mode to every text of one write (or one import) and counts what it replaced."""

    mode: str = DEFAULT_MODE
    kinds: Counter = field(default_factory=Counter)

    @classmethod
    def from_settings(cls, settings) -> "Redactor":
        return cls(settings.get("redaction", "mode") or DEFAULT_MODE)

    @property
    def count(self) -> int:
        return sum(self.kinds.values())

    def text(self, value: str | None, what: str = "text") -> str | None:
        if self.mode == "off" or not value:
            return value
        found = find(value)
        if not found:
            return value
        kinds = Counter(f.kind for f in found)
        if self.mode == "block":
            raise SecretRefused(f"refused: the {what} holds {len(found)} secret(s) ({kinds_text(kinds)}); "
                                '[redaction] mode = "block" refuses such writes: remove the secret, or set '
                                'mode = "redact" to store it as a [REDACTED:<kind>] marker')
        self.kinds.update(kinds)
        return replace(value, found)

    def value(self, value: Any, what: str = "meta") -> Any:
        if isinstance(value, str):
            return self.text(value, what)
        if isinstance(value, dict):
            return {k: self.value(v, what) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(v, what) for v in value]
        return value

    @classmethod
    def configured(cls) -> "Redactor":
        """For library calls that are given no settings (facts): the configured mode, as the CLI would load it."""
        from memctl import config

        return cls.from_settings(config.load())

    def note(self) -> str | None:
        """What the CLI says on stderr after a write that redacted something: count and kinds, never a value."""
        if not self.count:
            return None
        return (f"redacted {self.count} secret(s) before storing ({kinds_text(self.kinds)}); "
                "the stored text holds [REDACTED:<kind>] markers instead")
