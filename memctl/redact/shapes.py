"""The shapes of secrets detect-secrets misses: name=value pairs whose name names a secret, and
Authorization headers; shape_findings runs them with the secrets named in prose
(memctl.redact.prose).

The judgments of names and values are memctl.redact.names'; passwords on command lines are
memctl.redact.commands', provider keys memctl.redact.providers' (docs/secrets-and-export.md).
"""

from __future__ import annotations

import re
from functools import lru_cache

from memctl.redact.names import (
    CLOSERS,
    COMMON,
    HEAD,
    NAME_WORDS,
    Finding,
    looks_secret,
    name_kind,
    placeholder,
    strip_trailing,
    stripped_end,
    weak_password,
)
from memctl.redact.prose import fact_set_findings, said_findings, user_slash_findings

# The name a pair's separator ends, read backwards from the separator in the reversed text (one
# anchored match per separator, not a search of the 90 characters before it): blanks, maybe a
# closing quote, the name.
_NAME_TAIL_REVERSED = re.compile(r"[ \t]{0,8}['\"]?([\w.-]{1,81})")


def named_pair(text: str, low: str) -> bool:
    """Could the text hold a `name = value` pair whose name names a secret (`DB_PASSWORD=`,
    `"api_key":`)?

    Every pair _pair_findings can report has such a name right before its `=` or `:`. Ops text is
    full of "12:30" and of "key" in prose; looking behind each separator is ~10x cheaper than
    matching _PAIR.
    """
    if not ("=" in text or ":" in text) or not NAME_WORDS(text, low):
        return False
    reversed_low = low[::-1]
    for separator in "=:":
        at = low.find(separator)
        while at >= 0:
            name = _NAME_TAIL_REVERSED.match(reversed_low, len(low) - at)
            if name is not None and NAME_WORDS(name.group(1)[::-1], name.group(1)[::-1]):
                return True
            at = low.find(separator, at + 1)
    return False


# --- Shapes: name=value pairs, Authorization headers
# ----------------------------------------------------

# name, an optional closing quote, the separator, then a quoted or a bare value (a bare one ends at
# ; or a quote), the value in a lookahead so that a pair inside a quoted value is seen too
# (value="...;Password=x").
_PAIR = re.compile(
    r"(?<![\w.$?&%/])([A-Za-z][\w.-]{0,80})(['\"]?)"
    r"([ \t]*(?::=|=>|=(?![=~>])|:(?![:/\\]))[ \t]*)"
    r"(?=(['\"`])(.{0,1024}?)\4|([^\s'\"`;]))"
)
_BARE_RUN = re.compile(r"[^\s'\"`;]*+")
# The word before a pair's name, read backwards from the name (one anchored match, not a search of
# a window).
_PREV_WORD_REVERSED = re.compile(r"[ \t]{1,8}([\w-]{0,38}[A-Za-z])(?![\w-])")


@lru_cache(maxsize=4096)
def _names_words(name: str) -> bool:
    return NAME_WORDS(name, name.lower())


_AUTH_HEADER = re.compile(
    r"(?<![\w-])(?:proxy-)?authorization['\"]?[ \t]*[:=][ \t]*['\"]?"
    r"(?:(bearer|basic|token|negotiate|ntlm|apikey|api-key|sso-key|key|jwt|dpop)[ "
    r"\t]+)?([^\s'\",;]+)",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(?<![\w-])[Bb]earer[ \t]+([A-Za-z0-9._~+/-]{16,}=*)")
_DIGIT = re.compile(r"\d")


_OPENER = re.compile(r"[(\[{<]")
_NO_OPENERS: frozenset = frozenset()


class _BareValues:
    """Where a bare value starting at a position ends (its run of value characters, without trailing
    punctuation). Pairs inside one run (`token:token:...`) share its end: the run is measured once,
    and its trailing punctuation stripped once per set of openers, so the values of a line cost
    linear time in all."""

    def __init__(self, text: str):
        self.text, self.run = text, (-1, -1)
        self.last: dict[str, int] = {}
        self.ends: dict[frozenset, int] = {}

    def end(self, start: int) -> int:
        if not self.run[0] <= start < self.run[1]:
            run = _BARE_RUN.match(self.text, start)
            assert run is not None  # it matches the empty string
            self.run = (start, run.end())
            has = _OPENER.search(self.text, *self.run) is not None
            self.last = {o: self.text.rfind(o, *self.run) for o in CLOSERS.values()} if has else {}
            self.ends = {}
        openers = (
            frozenset(o for o, at in self.last.items() if at >= start) if self.last else _NO_OPENERS
        )
        end = self.ends.get(openers)
        if end is None:
            end = self.ends[openers] = stripped_end(self.text, start, self.run[1], set(openers))
        return max(start, end)


def _pair_findings(text: str) -> list[Finding]:
    """`name = value`, `name: value`, `"name": "value"` whose name names a secret: the value. A
    tight loop: hostile text holds a pair every few characters (`pw: pw: ...`)."""
    found: list[Finding] = []
    bare, reversed_text, at, size = _BareValues(text), None, 0, len(text)
    search, append = _PAIR.search, found.append
    while (m := search(text, at)) is not None:
        at = m.end()
        name, _, sep, quote, _, _ = m.groups()
        if not _names_words(name):
            continue
        full = name
        if "." not in name:
            if reversed_text is None:
                reversed_text = text[::-1]
            prev = _PREV_WORD_REVERSED.match(reversed_text, size - m.start())
            if prev is not None:
                full = f"{prev.group(1)[::-1]}_{name}"
        kind = name_kind(full)
        if kind is None or quote == "`":
            continue
        if sep[0] == "=" and sep[-1] in " \t":
            continue  # `PGPASSWORD= psql`: an empty assignment before a command
        quoted = quote is not None
        if quoted:
            start, end = m.span(5)
        else:
            start = m.start(6)
            end = bare.end(start)
        if end - start < 3:
            continue
        # judged by its head
        value = text[start:end] if end - start <= HEAD else text[start : start + HEAD]
        if "[REDACTED:" in value or placeholder(value, name):
            continue
        if not quoted and ":" in sep and not looks_secret(value, end - start):
            if kind != "password":
                continue
            phrase = _phrase_end(text, start)
            if phrase is not None:
                end = phrase  # `Password: correct horse battery staple`
            elif not weak_password(strip_trailing(value)):
                continue
        append(Finding(kind, start, end))
        # a pair inside this bare value adds nothing the merge keeps (`token:token:...`)
        if not quoted and end > at:
            at = end
    return found


_PHRASE_WORD = re.compile(r"[A-Za-z0-9!@#$%^&*+=-]{2,32}")


def _phrase_end(text: str, start: int) -> int | None:
    """The end of a passphrase that fills the rest of its line after `password:` (2 to 6 words, none
    common), or None. Looks at most HEAD characters."""
    if (
        start + HEAD <= len(text)
        and text.find("\n", start, start + HEAD) < 0
        and text.find(";", start, start + HEAD) < 0
    ):
        return None  # the line goes on past HEAD: no phrase fills it (the common case, uncopied)
    line = text[start : start + HEAD].split("\n", 1)[0].split(";", 1)[0]
    if len(line) == HEAD:
        return None
    words = line.rstrip(" \t\r.,").split()
    if not 2 <= len(words) <= 6 or any(
        not _PHRASE_WORD.fullmatch(w) or w.lower() in COMMON for w in words
    ):
        return None
    return start + len(line.rstrip(" \t\r.,"))


def _header_findings(text: str, low: str) -> list[Finding]:
    found = []
    if "authorization" in low:
        for m in _AUTH_HEADER.finditer(text):
            value = strip_trailing(m.group(2))
            if not placeholder(value) and len(value) >= 4 and (m.group(1) or looks_secret(value)):
                found.append(Finding("authorization", m.start(2), m.start(2) + len(value)))
    if "earer " in text:
        found.extend(
            Finding("bearer-token", *m.span(1))
            for m in _BEARER.finditer(text)
            if _DIGIT.search(m.group(1)) and not placeholder(m.group(1))
        )
    return found


def shape_findings(text: str, low: str) -> list[Finding]:
    found = _header_findings(text, low)
    if named_pair(text, low):
        found.extend(_pair_findings(text))
    if NAME_WORDS(text, low):
        found.extend(said_findings(text))
    if "/" in text and ("cred" in low or "login" in low):
        found.extend(user_slash_findings(text))
    if "fact" in low and "set" in low:
        found.extend(fact_set_findings(text))
    return found
