"""What names a secret and what is no secret: the judgments every finder of memctl.redact shares.

A name (a field, a fact key, a variable) names a secret by its last segment's last word
(`secret_name`, `name_kind`); a value that is a placeholder or a reference stands for a secret
without being one (`placeholder`); a bare value is a secret only if it looks like one
(`looks_secret`), or under a password's name if it is no common word (`weak_password`). Each judges
at most HEAD characters, so its cost is bounded (docs/secrets-and-export.md).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

MARKER = "[REDACTED:{}]"
# A value is judged by its first HEAD characters (and its length): the cost of judging one is
# bounded, so a line of ten thousand `token:` is judged in time linear in its length.
HEAD = 128


class Finding(NamedTuple):
    """A secret in a text: its kind (the marker's name) and its span. A named tuple: hostile text
    makes one per few characters, and a frozen dataclass costs four times as much to make."""

    kind: str
    start: int
    end: int


def any_word(*words: str):
    """A gate: does the lower-case text hold one of these words?"""
    return lambda text, low: any(w in low for w in words)


# A value that is already masked or a placeholder is not a secret.
NOT_A_SECRET = re.compile(
    r"^(?:\*+|\[REDACTED:[a-z0-9-]+\]|\$\{?\w+\}?|<[^>]*>|%\(?\w*\)?s?"
    r"|x+|X+)$"
)


# --- Names that name a secret --------------------------------------------------------------------

_SEGMENT = re.compile(r"[./:\\]")
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
# The last word of the name decides: password-like words give the kind "password", the rest
# "secret-keyword".
_SECRET_SUFFIXES = (
    ("password", "password"),
    ("passwd", "password"),
    ("passphrase", "password"),
    ("secret", "secret-keyword"),
    ("token", "secret-keyword"),
    ("apikey", "secret-keyword"),
    ("secretkey", "secret-keyword"),
    ("accesskey", "secret-keyword"),
    ("privatekey", "secret-keyword"),
    ("authkey", "secret-keyword"),
)
_SECRET_WORDS = {
    "pwd": "password",
    "pw": "password",
    "pass": "password",
    "requirepass": "password",
    "masterauth": "password",
    "credential": "secret-keyword",
    "credentials": "secret-keyword",
    "pat": "secret-keyword",
}
# A service whose "auth" is its password (redis.auth, registry_auth); auth alone is a method, not
# a secret.
_AUTH_MODIFIERS = {
    "basic",
    "http",
    "proxy",
    "redis",
    "smtp",
    "ldap",
    "registry",
    "docker",
    "mongo",
    "mongodb",
    "nats",
    "kafka",
    "rabbitmq",
    "amqp",
    "memcached",
    "api",
    "ftp",
    "imap",
    "vnc",
}
# Words after the secret's own name that say how it is written down, not what it is
# (SECRET_KEY_BASE).
_ENCODING_WORDS = {"base", "b64", "base64", "hex", "raw", "value", "data", "str", "string"}
# "key" alone names a secret only after one of these (api key, AWS_SECRET_ACCESS_KEY); not ssh,
# primary, public, sort, partition, cache, idempotency keys.
_KEY_MODIFIERS = {
    "api",
    "access",
    "secret",
    "private",
    "client",
    "auth",
    "encryption",
    "signing",
    "master",
    "service",
    "account",
    "app",
    "license",
    "db",
    "database",
    "priv",
    "hmac",
    "shared",
    "webhook",
    "subscription",
    "openai",
    "anthropic",
    "stripe",
    "sendgrid",
    "mailgun",
    "twilio",
}
# A token counted, paged or spliced into a prompt is no credential (max_tokens, page token,
# eos_token).
_TOKEN_NOT = {
    "max",
    "min",
    "num",
    "total",
    "input",
    "output",
    "prompt",
    "completion",
    "page",
    "next",
    "continuation",
    "cursor",
    "sync",
    "eos",
    "bos",
    "pad",
    "unk",
    "sep",
    "cls",
    "mask",
    "special",
    "stop",
    "start",
    "end",
    "first",
    "last",
    "per",
    "context",
}
NAME_WORDS = any_word("pass", "pw", "secret", "token", "key", "auth", "credential", "pat")


def name_kind(name: str) -> str | None:
    return _shortname_kind(name) if len(name) <= HEAD else _judge_name(name)


@lru_cache(maxsize=4096)
def _shortname_kind(name: str) -> str | None:
    return _judge_name(name)


def _judge_name(name: str) -> str | None:
    """The kind of secret a field, fact key or variable name names, or None. The last segment's last
    word decides; a last segment of one word (`openai.key`, `redis.auth`) takes the segment before
    it as its modifier."""
    segments = [seg for seg in _SEGMENT.split(name.strip()[:200]) if seg]
    words = [w.lower() for w in _WORD.findall(segments[-1])] if segments else []
    while len(words) > 1 and (words[-1].isdigit() or words[-1] in _ENCODING_WORDS):
        words.pop()
    if not words or words[-1].isdigit():
        return None
    last, before = words[-1], words[-2] if len(words) > 1 else ""
    if not before and len(segments) > 1:
        previous = _WORD.findall(segments[-2])
        before = previous[-1].lower() if previous else ""
    if last == "key":
        return "secret-keyword" if before in _KEY_MODIFIERS else None
    if last == "auth":
        return "secret-keyword" if before in _AUTH_MODIFIERS else None
    if last.endswith("token") and before in _TOKEN_NOT:
        return None
    for suffix, kind in _SECRET_SUFFIXES:
        if last.endswith(suffix):
            return kind
    return _SECRET_WORDS.get(last)


def secret_name(name: str) -> bool:
    """Does this field, fact key or variable name name a secret? Its last dotted segment decides, by
    its last word.

    True: db.password, api_token, aws.secret_access_key, openai_api_key, PGPASSWORD, clientSecret,
    smtp.pass. False: db.host, token_count, max_tokens, primary_key, ssh_key, public_key,
    password_policy.min_length, password_file, access_key_id (each names something about a secret,
    or no secret at all).
    """
    return name_kind(name) is not None


# --- Values that are no secret -------------------------------------------------------------------

# A placeholder, a reference to a secret kept elsewhere (a variable, a command, a file, a secret
# store).
_REFERENCE = re.compile(
    r"^(?:\.{3}|\u2026|-+|\?+|![A-Za-z]\w*|\[[^\]]*\]|\$\([^)]*\)?|%\w+%|\{\{.*\}\}|`.*"
    r"|[~.]{0,2}/.*|[A-Za-z]:\\.*"
    r"|(?:op|vault|keyring|secrets?|ssm|awssm|gcpsm|azkv|k8s|sops|env|file)://.*"
    r"|(?:vault|env|file):\S+"
    r"|arn:aws:(?:secretsmanager|ssm|kms):.*|[A-Za-z_][\w.]*[(\[].*)$"
)
# Words that say something about a secret (logfmt's token=expired) rather than being one.
_PLACEHOLDER_WORDS = {
    "none",
    "null",
    "nil",
    "true",
    "false",
    "yes",
    "no",
    "on",
    "off",
    "unset",
    "empty",
    "n/a",
    "na",
    "tbd",
    "todo",
    "redacted",
    "hidden",
    "masked",
    "required",
    "optional",
    "disabled",
    "enabled",
    "default",
    "undefined",
    "example",
    "expired",
    "invalid",
    "missing",
    "wrong",
    "revoked",
    "rotated",
    "refreshed",
    "present",
    "absent",
    "valid",
    "denied",
    "incorrect",
    "unknown",
    "blank",
    "generated",
    "provided",
    "error",
    "failed",
}


def placeholder(value: str, name: str = "") -> bool:
    """A value that stands for a secret without being one. A value that ends in its own name is a
    variable passed on (`password=password`, `token = self.token`). Short values are memoized
    (`_short_placeholder`)."""
    if len(value) <= HEAD and len(name) <= HEAD:
        return _short_placeholder(value, name)
    return _placeholder(value, name)


# Hostile text repeats one name and value thousands of times (`pw: pw: pw: ...`): the pure judgments
# of short strings are memoized, so a repeat costs a lookup. Bounded caches, short strings only.
@lru_cache(maxsize=4096)
def _short_placeholder(value: str, name: str) -> bool:
    return _placeholder(value, name)


def _placeholder(value: str, name: str) -> bool:
    value = value.strip()
    low = value.lower()
    if (
        not value
        or low in _PLACEHOLDER_WORDS
        or NOT_A_SECRET.match(value)
        or _REFERENCE.match(value)
    ):
        return True
    if not name:
        return False
    segment = _SEGMENT.split(name)[-1].lower()
    words = _WORD.findall(_SEGMENT.split(name)[-1])
    return low.rsplit(".", 1)[-1] in (segment, words[-1].lower() if words else segment)


# not - . _ : , ' which words, versions and times hold
_SYMBOLS = frozenset("!@#$%^&*+=/\\|?~<>()[]{}")


_LOWER = re.compile(r"[a-z]")
_UPPER = re.compile(r"[A-Z]")
DIGITS = re.compile(r"[0-9]")
_SYMBOL = re.compile("[" + re.escape("".join(sorted(_SYMBOLS))) + "]")
_ALPHA = re.compile(r"[^\W\d_]")


def looks_secret(value: str, length: int | None = None) -> bool:
    return _judge_looks_secret(value[:HEAD], len(value) if length is None else length)


@lru_cache(maxsize=4096)
def _judge_looks_secret(value: str, length: int) -> bool:
    """A bare word after `name:` is a secret only if it looks like one: `hunter2` does, `expired`
    does not. `value` may be the head of a longer value of `length` characters."""
    head, length = value[:HEAD], len(value) if length is None else length
    if not _ALPHA.search(head):
        return False  # 128/128, 12:30:00, 2026-03-02
    classes = (
        bool(_LOWER.search(head))
        + bool(_UPPER.search(head, 1))
        + bool(DIGITS.search(head))
        + bool(_SYMBOL.search(head))
    )
    return length >= 6 and classes >= 2 or length >= 16 and "-" not in head


CLOSERS = {")": "(", "]": "[", "}": "{", ">": "<"}


def strip_trailing(value: str) -> str:
    """A bare value without the sentence's punctuation after it: `hunter2.`, `(password=x)`, but
    `<your-key>`. Short values are memoized (`_short_strip_trailing`)."""
    return _short_strip_trailing(value) if len(value) <= HEAD else _stripped(value)


@lru_cache(maxsize=4096)
def _short_strip_trailing(value: str) -> str:
    return _stripped(value)


def _stripped(value: str) -> str:
    return value[: stripped_end(value, 0, len(value), {o for o in CLOSERS.values() if o in value})]


def stripped_end(text: str, start: int, end: int, openers: set) -> int:
    while end > start and (
        text[end - 1] in ".," or text[end - 1] in CLOSERS and CLOSERS[text[end - 1]] not in openers
    ):
        end -= 1
    return end


# Words that follow `password:` or `password is` in prose about a password, never as one.
COMMON = set(
    """the a an in on at of to for and or not no is was are be been set see same new old ok
             okay fine
good bad weak strong secure insecure short long here there this that it now still also too only
again reset change changed stored kept saved sent shared known unchanged different right case policy
manager field prompt below above attached given pending needed ready your my our their his her its
from with via by as will must should can cannot what which who where when how why if then than so
but all any some none both each every per please use used ask asked do does did done has have had
get got make made same vault file env environment prod production staging test correctly incorrectly
wrong expired rotated hashed salted encrypted auth authentication login logins protection protected
less free based only hash hint length strength complexity requirement requirements rule rules expiry
history reuse storage store generator form box dialog screen page link email flow update sync expire
expires expiring rotate rotates rotation one ones something someone default generated random
stronger longer shorter temporary""".split()
)
_PROSE_ENDING = re.compile(r"[a-z]+(?:ed|ing|ly|ion|ions|ment|ness)")


def weak_password(value: str) -> bool:
    return len(value) <= HEAD and _short_weak_password(value)


@lru_cache(maxsize=4096)
def _short_weak_password(value: str) -> bool:
    """A one-word value under a password's name: even `admin` or `changeme` is somebody's password;
    a common word, a word that reads as a verb or adverb (`stored`, `rotating`), or a placeholder is
    not."""
    low = value.lower()
    return (
        3 <= len(value) <= HEAD
        and _ALPHA.search(value) is not None
        and low not in COMMON
        and not _PROSE_ENDING.fullmatch(low)
        and not placeholder(value)
    )
