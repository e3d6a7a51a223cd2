"""Secrets named in prose: `the password is X`, `set the root password to X`, `credentials: admin /
X`, `memctl fact set db.password X` (docs/secrets-and-export.md).
"""

from __future__ import annotations

import re

from memctl.redact.names import (
    COMMON,
    DIGITS,
    Finding,
    looks_secret,
    name_kind,
    placeholder,
    strip_trailing,
    weak_password,
)

# A secret named in prose, then its value (issue 37; issue 50: the verbs and contexts of typed
# passwords):
#   `password is hunter2xyz`, `the root password is changeme`,
#   `the wifi password for the office is Sunflower42`,
#   `the passphrase is set to X`, `the password was changed to X`, `is now X`, `has been set to X`
#   (a verb);
#   `set the root password to X`, `changed bob's password to X` (to, after
#   set/change/reset/update/rotate);
#   `log in as ops with password X`, `with the passphrase 'blue river stone'`, `(password toor)`,
#   `, password X`;
#   `aws secret access key wJalr...` (nothing: the word must look strongly like a secret).
# A secret-looking word, or a weak password (`toor`) that ends the clause; a quoted value whole.
_SAID = re.compile(
    r"(?<![A-Za-z])(password|passwd|passphrase|pwd|pw|secret|token|key|pat|"
    r"credentials?)"
    r"(?:[ \t]{1,8}for[ \t]{1,8}"
    r"(?:(?:the|an?|our|my|his|her|their|new)[ \t]{1,8})?[\w-]{1,30})?"
    r"(?:[ \t]{1,8}(is|was|has[ \t]{1,8}been|had[ \t]{1,8}been)(?:[ \t]{1,8}now)?)?"
    r"(?:[ \t]{1,8}(?:(set|changed|reset|updated|rotated)[ \t]{1,8})?(to))?"
    r"[ \t]{1,8}(?:(['\"])([^'\"\n]{3,128})\5|['\"]?([^\s'\"]{3,128}))",
    re.IGNORECASE,
)
# A word before a name, read backwards in the reversed text: one anchored match a word (five at
# most).
_WORD_BEFORE_REVERSED = re.compile(r"[ \t]{1,8}([\w'-]{0,30}[A-Za-z])(?![\w-])")
_CLAUSE_END = re.compile(
    r"['\"]?[ \t]*"
    r"(?:$|[\r\n.,;!)]|(?:for|and|on|in|at|this|yesterday|today|now)\b)"
)
_SETTING = re.compile(
    r"(?:set|sets|setting|change|changed|changes|changing|reset|resets|update|"
    r"updated|updates|rotate|rotated|rotates)"
)
_GIVING = {"with", "using", "use", "via"}  # `with password X`: the name, then its value


def _words_before(text: str, reversed_text: str, at: int) -> list[str]:
    """Up to five words before position `at`, in text order."""
    words: list[str] = []
    position = len(text) - at
    while (
        len(words) < 5 and (m := _WORD_BEFORE_REVERSED.match(reversed_text, position)) is not None
    ):
        words.append(m.group(1)[::-1])
        position = m.end()
    return words[::-1]


def said_findings(text: str) -> list[Finding]:
    found, reversed_text = [], None
    for m in _SAID.finditer(text):
        reversed_text = text[::-1] if reversed_text is None else reversed_text
        before = _words_before(text, reversed_text, m.start())
        words = [w for w in before if w.lower() not in COMMON and not _SETTING.fullmatch(w.lower())]
        name = "_".join(words[-2:] + [m.group(1)])
        kind = name_kind(name)
        quoted = m.group(6) is not None
        value = m.group(6) if quoted else strip_trailing(m.group(7))
        start = m.start(6) if quoted else m.start(7)
        if kind is None or len(value) < 3 or placeholder(value, name) or value.lower() in COMMON:
            continue
        end = start + len(value)
        ended = _CLAUSE_END.match(text, end) is not None
        weak = kind == "password" and weak_password(value) and ended
        verb, to = m.group(2), m.group(4)
        gives = (
            bool(before)
            and before[-1].lower() in _GIVING
            or len(before) > 1
            and before[-1].lower() == "the"
            and before[-2].lower() in _GIVING
            or text[max(0, m.start() - 2) : m.start()].rstrip()[-1:] in ("(", ",")
        )
        if (
            to
            and not verb
            and not m.group(3)
            and not any(_SETTING.fullmatch(w.lower()) for w in before)
        ):
            continue  # `sent the password to bob`: no setting verb, so `to` gives no value
        if verb or to or gives:
            ok = quoted and kind == "password" or looks_secret(value) or weak
        else:
            ok = (
                len(value) >= 12
                and looks_secret(value)
                and bool(DIGITS.search(value))
                and "-" not in value
            )
        if ok:
            found.append(Finding(kind, start, end))
    return found


# `credentials: admin / Adm1nPw!`, `login alice/Hunter2x`: a user, a slash, a password.
_USER_SLASH = re.compile(
    r"(?<![A-Za-z])(?:credentials?|creds|login)[ \t]{0,8}[:=]?[ \t]{1,8}"
    r"([\w.@-]{1,64})[ \t]{0,8}/[ \t]{0,8}([^\s'\"/]{3,128})",
    re.IGNORECASE,
)


def user_slash_findings(text: str) -> list[Finding]:
    found = []
    for m in _USER_SLASH.finditer(text):
        value = strip_trailing(m.group(2))
        end = m.start(2) + len(value)
        if (
            len(value) >= 3
            and not placeholder(value)
            and (
                looks_secret(value)
                or weak_password(value)
                and _CLAUSE_END.match(text, end) is not None
            )
        ):
            found.append(Finding("password", m.start(2), end))
    return found


# `memctl fact set db.password Hunter2xyz` typed into a note: the value of a fact whose key names
# a secret.
_FACT_SET = re.compile(
    r"(?<![\w-])fact[ \t]+set[ \t]+['\"]?([\w.:/-]{1,200})['\"]?[ \t]+"
    r"(?:(['\"])(.{1,1024}?)\2|([^\s'\"]\S*+))"
)


def fact_set_findings(text: str) -> list[Finding]:
    found = []
    for m in _FACT_SET.finditer(text):
        kind, group = name_kind(m.group(1)), 3 if m.group(3) is not None else 4
        if kind and len(m.group(group)) >= 3 and not placeholder(m.group(group), m.group(1)):
            found.append(Finding(kind, *m.span(group)))
    return found
