"""Finding secrets: detect-secrets' regex plugins, whole private keys, URL passwords, and the shapes of
memctl.redact.shapes, each behind a cheap substring gate; `find` merges them into non-overlapping spans.
"""

from __future__ import annotations

import bisect
import re
from functools import lru_cache
from typing import Any, Callable

from memctl.redact import keyword
from memctl.redact.commands import command_findings, command_words
from memctl.redact.providers import provider_findings
from memctl.redact.names import NOT_A_SECRET, Finding, any_word
from memctl.redact.shapes import named_pair, shape_findings

_MARKER = re.compile(r"\[REDACTED:[a-z0-9-]+\]")

# detect-secrets plugins not used (see the module docstring).
EXCLUDED_PLUGINS = {
    "Base64HighEntropyString",
    "HexHighEntropyString",
    "IPPublicDetector",
    "BasicAuthDetector",
}
KIND_NAMES = {
    "AWS Access Key": "aws-access-key",
    "Secret Keyword": "secret-keyword",
    "Private Key": "private-key",
}

# A PEM or OpenSSH private key, BEGIN to END (or, cut off, to the end of its base64 lines). The END line is
# looked up among all END lines found once (`_private_keys`), never searched for again from each BEGIN.
_KEY_BEGIN = re.compile(r"-----BEGIN ((?:[A-Z0-9]{1,12} ){0,4})PRIVATE KEY(?: BLOCK)?-----")
_KEY_END = re.compile(r"-----END ((?:[A-Z0-9]{1,12} ){0,4})PRIVATE KEY(?: BLOCK)?-----")
_KEY_LINES = re.compile(r"(?:[ \t]*\r?\n[ \t]*[A-Za-z0-9+/=:-][^\n]*+)*+")
# scheme://user:password@host: the password runs to the last @ of its whitespace-delimited token, as in
# config.mask_secrets. A scheme starts where no scheme character precedes it and is at most 32 long, so
# no position is the start of more than one attempt (`_url_findings`).
_URL_HEAD = re.compile(r"(?<![a-zA-Z0-9+.-])[a-zA-Z][a-zA-Z0-9+.-]{0,31}://[^\s:/@?#]*+:")
_TOKEN = re.compile(r"\S+")
# ?password=... / ?token=... in a URL's query string (a libpq password=... pair is a name=value pair: _PAIR).
_QUERY_SECRET = re.compile(
    r"[?&](?:(?:ssl)?(?:password|passwd|pwd)|token|api[_-]?key|access[_-]?token|secret)=([^&#\s'\"]+)",
    re.IGNORECASE,
)
# Per plugin, a cheap test that every match of its patterns implies (a keyword, a prefix, a
# quote), on the text and its lower-case copy: a plugin whose gate fails is not run. Plain
# substring tests, because Python's re is slow on case-insensitive alternations (measured:
# 30-40 us per 300-character line for each such gate as a regex; the keyword plugin itself
# costs 230 us).
_QUOTED = re.compile(r"['\"`]")


GATES = {
    # the plugin (230 us a line) needs a quote and one of its DENYLIST words
    "secret-keyword": lambda text, low: (
        _QUOTED.search(text) is not None
        and any(w in low for w in ("key", "pass", "pwd", "secret", "contrase"))
    ),
    "cloudant-credentials": any_word("key", "pw", "pass", "token", "cloudant"),
    "softlayer-credentials": any_word("key", "pw", "pass", "token"),
    "ibm-cloud-iam-key": any_word("key", "pw", "pass", "token"),
    "ibm-cos-hmac-credentials": any_word("secret"),
    "artifactory-credentials": lambda text, low: "AKC" in text or "AP" in text,
    "mailchimp-access-key": any_word("-us"),
    "aws-access-key": lambda text, low: (
        "aws" in low or "A3T" in text or "IA" in text or "ACCA" in text
    ),
    "slack-token": any_word("xox", "hooks.slack.com"),
    "json-web-token": lambda text, low: "eyJ" in text,
    "private-key": any_word("private key", "putty"),
    "npm-tokens": any_word("_authtoken"),
    "pypi-token": any_word("pypi-"),
    "sendgrid-api-key": lambda text, low: "SG." in text,
    "stripe-access-key": any_word("k_live_"),
    "azure-storage-account-access-key": lambda text, low: "AccountKey=" in text,
    "github-token": lambda text, low: (
        "_" in text and any(p in text for p in ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"))
    ),
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
    if (
        "://" in text
        or "private key" in low
        or "putty" in low
        or "passw" in low
        or "passphrase" in low
        or _QUOTED.search(text)
    ):
        return True
    if (
        named_pair(text, low)
        or command_words(text, low)
        or "/" in text
        and ("cred" in low or "login" in low)
    ):
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
    from detect_secrets.plugins.base import BasePlugin, RegexBasedDetector

    plugins = []
    mapping: dict[str, type[BasePlugin]]
    mapping = get_mapping_from_secret_type_to_class()  # type: ignore[assignment]  # its TypeVar is in the return alone
    for secret_type, plugin in sorted(mapping.items()):
        if plugin.__name__ in EXCLUDED_PLUGINS:
            continue
        kind = KIND_NAMES.get(secret_type) or re.sub(r"[^a-z0-9]+", "-", secret_type.lower()).strip(
            "-"
        )
        plain = (
            issubclass(plugin, RegexBasedDetector)
            and plugin.analyze_string is RegexBasedDetector.analyze_string
        )
        plugins.append((kind, plugin(), GATES.get(kind), plain))
    return tuple(plugins)


# detect-secrets' patterns are not written for hostile text (its JWT pattern rescans a run of `eyJ` from each
# one): each sees at most WINDOW characters at a time, windows overlapping by OVERLAP (longer than any secret
# they match), so their cost is linear in the text whatever they do inside a window.
WINDOW, OVERLAP = 1024, 256


def _windows(text: str, start: int = 0, stop: int | None = None):
    """(start, end) of the windows covering text[start:stop]."""
    stop = len(text) if stop is None else stop
    while True:
        yield start, min(stop, start + WINDOW)
        if start + WINDOW >= stop:
            return
        start += WINDOW - OVERLAP


_WORDISH = re.compile(r"[\w-]")


def _occurrences(text: str, value: str, kind: str, start: int, end: int) -> list[Finding]:
    """Where a value a plugin reported in text[start:end] sits there; a short one only as a whole word."""
    value = value.strip(" \t\r\n\"'`")
    if len(value) < 4:
        return []
    found, size, at = [], len(value), text.find(value, start, end)
    while at >= 0:
        after = at + size
        # A short one only between characters that are not word characters or hyphens (compiling a pattern for
        # each value cost 50-100 us: hostile lines each holding another value were 0.2 MB/s).
        if size >= 12 or (
            (at == 0 or _WORDISH.match(text, at - 1) is None)
            and (after >= end or _WORDISH.match(text, after) is None)
        ):
            found.append(Finding(kind, at, after))
            at = text.find(value, after, end)
        else:
            at = text.find(value, at + 1, end)
    return found


# A plugin pattern that needs more than its plugin's gate, by its source: AWS's secret key after `aws` (lazy
# `.{0,20}?` twice around a case-insensitive alternation, from every `aws`) needs a quote then 40 key characters
# (as re.IGNORECASE reads [0-9a-zA-Z]: the Kelvin sign, long s, dotted and dotless i too).
PATTERN_NEEDS = {
    r"aws.{0,20}?(?:key|pwd|pw|password|pass|token).{0,20}?[\'\"]([0-9a-zA-Z/+]{40})[\'\"]": re.compile(
        "['\"][0-9a-zA-Z/+\u212a\u017f\u0130\u0131]{40}"
    ),
}


def _regex_findings(
    text: str, kind: str, plugin, window_start: int, window_end: int
) -> list[Finding]:
    """A plain regex plugin's matches in text[start:end] as spans: its capture group when that is the secret,
    else the whole match. (Its analyze_string reports a group's text, for the GitHub pattern the bare "ghp".)
    """
    found = []
    for regex in plugin.denylist:
        needs = PATTERN_NEEDS.get(regex.pattern)
        if needs is not None and needs.search(text, window_start, window_end) is None:
            continue
        for match in regex.finditer(text, window_start, window_end):
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


# A JWT starts where no token character precedes it (so a run of `eyJ` is one attempt, not one per `eyJ`), and
# runs on to its signature, which the plugin's lazy pattern leaves out; the plugin checks header and payload.
_JWT = re.compile(r"(?<![\w=-])(eyJ[\w=-]*+\.[\w=-]++)(?:\.[\w.+/=-]*+)?")


def _jwt_findings(text: str, plugin) -> list[Finding]:
    return [
        Finding("json-web-token", *m.span())
        for m in _JWT.finditer(text)
        if plugin.is_formally_valid(m.group(1))
    ]


_LINE = re.compile(r"[^\r\n]+")


# Plugins whose every pattern holds a run of this many characters of [\w-] (their secret: 24 letters or 64 hex
# digits for Cloudant, 44 for IBM Cloud IAM, 64 for SoftLayer, 48 hex digits for IBM COS): a window without a run
# that long is not given to them. They run on any text with `key`, `pw`, `pass`, `token` or `secret` in it, at
# 0.1 us a character each.
RUN_NEEDED = {
    "cloudant-credentials": 24,
    "ibm-cloud-iam-key": 44,
    "softlayer-credentials": 64,
    "ibm-cos-hmac-credentials": 48,
}


# ASCII characters that end a run of [\w-], as blanks (other characters are kept: a run found is maybe longer than
# the plugins' own, never shorter).
_RUN_BREAKS = str.maketrans({chr(c): " " for c in range(128) if not re.match(r"[\w-]", chr(c))})


def _has_run(long_tokens: list[tuple[int, int]], start: int, end: int, need: int) -> bool:
    """Does one of the runs (sorted spans) hold `need` characters inside text[start:end]?"""
    at = bisect.bisect_right(long_tokens, (start, start))
    at = max(0, at - 1)
    while at < len(long_tokens) and long_tokens[at][0] < end:
        if min(end, long_tokens[at][1]) - max(start, long_tokens[at][0]) >= need:
            return True
        at += 1
    return False


def _plugin_findings(text: str, low: str) -> list[Finding]:
    found: list[Finding] = []
    long_tokens: list[tuple[int, int]] | None = None
    for kind, plugin, gate, plain in _plugins():
        if gate is not None and not gate(text, low):
            continue
        if kind == "json-web-token":
            found.extend(_jwt_findings(text, plugin))
        elif plain:
            need = RUN_NEEDED.get(kind)
            if need and long_tokens is None:
                runs, shortest = text.translate(_RUN_BREAKS), min(RUN_NEEDED.values())
                long_tokens = (
                    [m.span() for m in _TOKEN.finditer(runs) if m.end() - m.start() >= shortest]
                    if max(map(len, runs.split()), default=0) >= shortest
                    else []
                )
            for start, end in _windows(text):
                if need and not _has_run(
                    long_tokens or [], start, end, need
                ):  # made above when needed
                    continue
                found.extend(_regex_findings(text, kind, plugin, start, end))
        elif kind == "secret-keyword":
            # The keyword plugin reports one value per pattern per call: one line (window) at a time, its values
            # found by memctl.redact.keyword (the same values in linear time).
            word_starts = keyword.starts(text, low)
            assert gate is not None  # GATES has the keyword plugin's
            for line in _LINE.finditer(text):
                span = line.span()
                at = bisect.bisect_left(word_starts, span[0])
                if at == len(word_starts) or word_starts[at] >= span[1]:
                    continue  # no DENYLIST word in the line: every pattern starts with one or ends with one
                for start, end in _windows(text, *span) if span[1] - span[0] > WINDOW else (span,):
                    piece = text[start:end]
                    if not gate(piece, piece.lower()):
                        continue
                    for value in keyword.values(text, start, end, word_starts):
                        found.extend(_occurrences(text, value, kind, start, end))
        else:
            for start, end in _windows(text):
                piece = text[start:end]
                if gate is not None and not gate(piece, piece.lower()):
                    continue
                for value in set(plugin.analyze_string(piece)):
                    found.extend(_occurrences(text, value, kind, start, end))
    return found


def _private_keys(text: str) -> list[Finding]:
    """Each BEGIN line to the first matching END line after it (or to the end of its base64 lines)."""
    ends: dict[str, list[tuple[int, int]]] = {}
    for m in _KEY_END.finditer(text):
        ends.setdefault(m.group(1), []).append(m.span())
    found: list[Finding] = []
    for begin in _KEY_BEGIN.finditer(text):
        if found and begin.start() < found[-1].end:
            continue  # a BEGIN inside a key already found
        same = ends.get(begin.group(1), [])
        at = bisect.bisect_left(same, (begin.end(), 0))
        if at < len(same):
            end = same[at][1]
        else:
            lines = _KEY_LINES.match(text, begin.end())
            assert lines is not None  # it matches the empty string
            end = lines.end()
        found.append(Finding("private-key", begin.start(), end))
    return found


def _url_findings(text: str) -> list[Finding]:
    """URL passwords: for each token holding `://`, the password of each URL in it runs to the token's last @."""
    found: list[Finding] = []
    for token in _TOKEN.finditer(text):
        if "://" not in token.group():
            continue
        last_at = token.group().rfind("@") + token.start()
        for head in _URL_HEAD.finditer(text, token.start(), token.end()):
            if head.end() < last_at and not (found and head.end() < found[-1].end):
                found.append(Finding("url-password", head.end(), last_at))
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
        found.extend(_private_keys(text))
    if "://" in text:
        found.extend(_url_findings(text))
    if "=" in text:
        found.extend(Finding("url-secret", *m.span(1)) for m in _QUERY_SECRET.finditer(text))
    # In this order, because the first of two findings with the same span names it: a provider's key
    # before the plugins' guesses (an IBM "key" of 44 characters), both before a secret-like name.
    found.extend(provider_findings(text))
    found.extend(_plugin_findings(text, low))
    if command_words(text, low) or "--" in text:
        found.extend(command_findings(text))
    found.extend(shape_findings(text, low))
    if not found:
        return []
    # One finding per span, the first (detectors report the same value again: the keyword plugin's values, windows
    # overlapping), then those inside a marker or that are no secret dropped.
    found = list({(f.start, f.end): f for f in reversed(found)}.values())
    if "[REDACTED:" in text:
        markers = [m.span() for m in _MARKER.finditer(text)]
        found = [f for f in found if not _in_marker(markers, f)]
    return _merge([f for f in found if not NOT_A_SECRET.match(text[f.start : f.end])])


def _in_marker(markers: list[tuple[int, int]], finding: Finding) -> bool:
    """Is the finding inside one of the text's markers (their spans, in order)?"""
    at = bisect.bisect_right(markers, (finding.start, float("inf")))
    return at > 0 and markers[at - 1][0] <= finding.start and finding.end <= markers[at - 1][1]


def _merge(found: list[Finding]) -> list[Finding]:
    kept: list[Finding] = []
    for item in sorted(found, key=lambda f: (f.start, -(f.end - f.start))):
        if kept and item.start < kept[-1].end:
            if item.end > kept[-1].end:
                kept[-1] = Finding(kept[-1].kind, kept[-1].start, item.end)
            continue
        kept.append(item)
    return kept
