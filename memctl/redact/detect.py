"""Finding secrets: detect-secrets' regex plugins, whole private keys, URL passwords, and the shapes of
memctl.redact.shapes, each behind a cheap substring gate; `find` merges them into non-overlapping spans.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Callable

from memctl.redact.shapes import (
    NOT_A_SECRET,
    Finding,
    any_word,
    command_words,
    named_pair,
    provider_findings,
    shape_findings,
)

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
# ?password=... / ?token=... in a URL's query string (a libpq password=... pair is a name=value pair: _PAIR).
_QUERY_SECRET = re.compile(
    r"[?&](?:(?:ssl)?(?:password|passwd|pwd)|token|api[_-]?key|access[_-]?token|secret)=([^&#\s'\"]+)", re.IGNORECASE)
# Per plugin, a cheap test that every match of its patterns implies (a keyword, a prefix, a
# quote), on the text and its lower-case copy: a plugin whose gate fails is not run. Plain
# substring tests, because Python's re is slow on case-insensitive alternations (measured:
# 30-40 us per 300-character line for each such gate as a regex; the keyword plugin itself
# costs 230 us).
_QUOTED = re.compile(r"['\"`]")



GATES = {
    # the plugin (230 us a line) needs a quote and one of its DENYLIST words
    "secret-keyword": lambda text, low: (_QUOTED.search(text) is not None
                                         and any(w in low for w in ("key", "pass", "pwd", "secret", "contrase"))),
    "cloudant-credentials": any_word("key", "pw", "pass", "token", "cloudant"),
    "softlayer-credentials": any_word("key", "pw", "pass", "token"),
    "ibm-cloud-iam-key": any_word("key", "pw", "pass", "token"),
    "ibm-cos-hmac-credentials": any_word("secret"),
    "artifactory-credentials": lambda text, low: "AKC" in text or "AP" in text,
    "mailchimp-access-key": any_word("-us"),
    "aws-access-key": lambda text, low: "aws" in low or "A3T" in text or "IA" in text or "ACCA" in text,
    "slack-token": any_word("xox", "hooks.slack.com"),
    "json-web-token": lambda text, low: "eyJ" in text,
    "private-key": any_word("private key", "putty"),
    "npm-tokens": any_word("_authtoken"),
    "pypi-token": any_word("pypi-"),
    "sendgrid-api-key": lambda text, low: "SG." in text,
    "stripe-access-key": any_word("k_live_"),
    "azure-storage-account-access-key": lambda text, low: "AccountKey=" in text,
    "github-token": lambda text, low: "_" in text and any(p in text for p in ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),
    "gitlab-token": lambda text, low: "-" in text and ("gl" in text or "GR1348941" in text),
    "openai-token": lambda text, low: "T3BlbkFJ" in text,
    "square-oauth-secret": lambda text, low: "sq0csp-" in text,
    "telegram-bot-token": lambda text, low: ":" in text,
    "twilio-api-key": lambda text, low: "AC" in text or "SK" in text,
    "discord-bot-token": lambda text, low: text.count(".") >= 2,
}


# A commit id, a sha256 sum, a UUID, a trace id: hex with separators. No plugin used here matches
# one unless a keyword (key, token, secret, ...) is near, so such a token alone is no reason to run them.
_HEXISH = re.compile(r"[(\[\"'`]*(?:sha\d{1,3}[:=-])?[0-9a-fA-F][0-9a-fA-F:.\-]*[)\]\"'`,.;:]*")
_KEYWORDS = any_word("key", "pw", "pass", "token", "secret", "cloudant", "auth", "bearer")


def candidate(text: str, low: str) -> bool:
    """Could any detector match at all? A long token, a URL, a key line, a quote, a secret-like name before
    `=` or `:`, or a command that takes a password."""
    if "://" in text or "private key" in low or "putty" in low or "password" in low or _QUOTED.search(text):
        return True
    if named_pair(text, low) or command_words(text, low):
        return True
    tokens = text.split()
    if max(map(len, tokens), default=0) < 16:
        return False
    long = [t for t in tokens if len(t) >= 16]
    if "[REDACTED:" in text:
        long = [t for t in long if len(_MARKER.sub("", t)) >= 16]
    plain = [t for t in long if not _HEXISH.fullmatch(t)]
    return bool(plain) or (bool(long) and _KEYWORDS(text, low))




@lru_cache(maxsize=1)
def _plugins() -> tuple[tuple[str, Any, Callable[[str, str], bool] | None, bool], ...]:
    """(kind, plugin instance, its gate, is a plain regex plugin) for every detect-secrets plugin used."""
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins.base import RegexBasedDetector

    plugins = []
    for secret_type, plugin in sorted(get_mapping_from_secret_type_to_class().items()):
        if plugin.__name__ in EXCLUDED_PLUGINS:
            continue
        kind = KIND_NAMES.get(secret_type) or re.sub(r"[^a-z0-9]+", "-", secret_type.lower()).strip("-")
        plain = issubclass(plugin, RegexBasedDetector) and plugin.analyze_string is RegexBasedDetector.analyze_string
        plugins.append((kind, plugin(), GATES.get(kind), plain))
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
    found: list[Finding] = []
    for kind, plugin, gate, plain in _plugins():
        if gate is not None and not gate(text, low):
            continue
        if plain:
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
    if not candidate(text, low):
        return []
    found: list[Finding] = []
    if "private key" in low:
        found.extend(Finding("private-key", *m.span()) for m in _PRIVATE_KEY.finditer(text))
    if "://" in text:
        found.extend(Finding("url-password", *m.span(1)) for m in _URL_PASSWORD.finditer(text))
    if "=" in text:
        found.extend(Finding("url-secret", *m.span(1)) for m in _QUERY_SECRET.finditer(text))
    # In this order, because the first of two findings with the same span names it: a provider's key
    # before the plugins' guesses (an IBM "key" of 44 characters), both before a secret-like name.
    found.extend(provider_findings(text))
    found.extend(_plugin_findings(text, low))
    found.extend(shape_findings(text, low))
    if not found:
        return []
    return _merge([f for f in found if not NOT_A_SECRET.match(text[f.start:f.end]) and not _in_marker(text, f)])


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


