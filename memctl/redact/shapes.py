"""The shapes of secrets detect-secrets misses (memctl.redact's docstring lists them), and what is no secret.

Names that name a secret (`secret_name`), values that only stand for one (`placeholder`), and the
finders for name=value pairs, Authorization headers and secrets named in prose (passwords on command
lines: memctl.redact.commands; provider keys: memctl.redact.providers).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

MARKER = "[REDACTED:{}]"
# A value is judged by its first HEAD characters (and its length): the cost of judging one is bounded, so a
# line of ten thousand `token:` is judged in time linear in its length.
HEAD = 128


class Finding(NamedTuple):
    """A secret in a text: its kind (the marker's name) and its span. A named tuple: hostile text makes one per
    few characters, and a frozen dataclass costs four times as much to make."""

    kind: str
    start: int
    end: int


def any_word(*words: str):
    """A gate: does the lower-case text hold one of these words?"""
    return lambda text, low: any(w in low for w in words)


# A value that is already masked or a placeholder is not a secret.
NOT_A_SECRET = re.compile(r"^(?:\*+|\[REDACTED:[a-z0-9-]+\]|\$\{?\w+\}?|<[^>]*>|%\(?\w*\)?s?|x+|X+)$")


# --- Names that name a secret ---------------------------------------------------------------------------

_SEGMENT = re.compile(r"[./:\\]")
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
# The last word of the name decides: password-like words give the kind "password", the rest "secret-keyword".
_SECRET_SUFFIXES = (("password", "password"), ("passwd", "password"), ("passphrase", "password"),
                    ("secret", "secret-keyword"), ("token", "secret-keyword"), ("apikey", "secret-keyword"),
                    ("secretkey", "secret-keyword"), ("accesskey", "secret-keyword"),
                    ("privatekey", "secret-keyword"), ("authkey", "secret-keyword"))
_SECRET_WORDS = {"pwd": "password", "pw": "password", "pass": "password", "requirepass": "password",
                 "masterauth": "password", "credential": "secret-keyword", "credentials": "secret-keyword",
                 "pat": "secret-keyword"}
# A service whose "auth" is its password (redis.auth, registry_auth); auth alone is a method, not a secret.
_AUTH_MODIFIERS = {"basic", "http", "proxy", "redis", "smtp", "ldap", "registry", "docker", "mongo", "mongodb",
                   "nats", "kafka", "rabbitmq", "amqp", "memcached", "api", "ftp", "imap", "vnc"}
# Words after the secret's own name that say how it is written down, not what it is (SECRET_KEY_BASE).
_ENCODING_WORDS = {"base", "b64", "base64", "hex", "raw", "value", "data", "str", "string"}
# "key" alone names a secret only after one of these (api key, AWS_SECRET_ACCESS_KEY); not ssh, primary,
# public, sort, partition, cache, idempotency keys.
_KEY_MODIFIERS = {"api", "access", "secret", "private", "client", "auth", "encryption", "signing", "master",
                  "service", "account", "app", "license", "db", "database", "priv", "hmac", "shared", "webhook",
                  "subscription", "openai", "anthropic", "stripe", "sendgrid", "mailgun", "twilio"}
# A token counted, paged or spliced into a prompt is no credential (max_tokens, page token, eos_token).
_TOKEN_NOT = {"max", "min", "num", "total", "input", "output", "prompt", "completion", "page", "next", "continuation",
              "cursor", "sync", "eos", "bos", "pad", "unk", "sep", "cls", "mask", "special", "stop", "start", "end",
              "first", "last", "per", "context"}
NAME_WORDS = any_word("pass", "pw", "secret", "token", "key", "auth", "credential", "pat")
# The name a pair's separator ends, read backwards from the separator in the reversed text (one anchored match
# per separator, not a search of the 90 characters before it): blanks, maybe a closing quote, the name.
_NAME_TAIL_REVERSED = re.compile(r"[ \t]{0,8}['\"]?([\w.-]{1,81})")


def named_pair(text: str, low: str) -> bool:
    """Could the text hold a `name = value` pair whose name names a secret (`DB_PASSWORD=`, `"api_key":`)?

    Every pair _pair_findings can report has such a name right before its `=` or `:`. Ops text is full of
    "12:30" and of "key" in prose; looking behind each separator is ~10x cheaper than matching _PAIR.
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


def name_kind(name: str) -> str | None:
    return _shortname_kind(name) if len(name) <= HEAD else _judge_name(name)


@lru_cache(maxsize=4096)
def _shortname_kind(name: str) -> str | None:
    return _judge_name(name)


def _judge_name(name: str) -> str | None:
    """The kind of secret a field, fact key or variable name names, or None. The last segment's last word
    decides; a last segment of one word (`openai.key`, `redis.auth`) takes the segment before it as its modifier."""
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
    """Does this field, fact key or variable name name a secret? Its last dotted segment decides, by its last word.

    True: db.password, api_token, aws.secret_access_key, openai_api_key, PGPASSWORD, clientSecret, smtp.pass.
    False: db.host, token_count, max_tokens, primary_key, ssh_key, public_key, password_policy.min_length,
    password_file, access_key_id (each names something about a secret, or no secret at all).
    """
    return name_kind(name) is not None


# --- Values that are no secret ----------------------------------------------------------------------------

# A placeholder, a reference to a secret kept elsewhere (a variable, a command, a file, a secret store).
_REFERENCE = re.compile(
    r"^(?:\.{3}|\u2026|-+|\?+|![A-Za-z]\w*|\[[^\]]*\]|\$\([^)]*\)?|%\w+%|\{\{.*\}\}|`.*|[~.]{0,2}/.*|[A-Za-z]:\\.*"
    r"|(?:op|vault|keyring|secrets?|ssm|awssm|gcpsm|azkv|k8s|sops|env|file)://.*|(?:vault|env|file):\S+"
    r"|arn:aws:(?:secretsmanager|ssm|kms):.*|[A-Za-z_][\w.]*[(\[].*)$")
# Words that say something about a secret (logfmt's token=expired) rather than being one.
_PLACEHOLDER_WORDS = {"none", "null", "nil", "true", "false", "yes", "no", "on", "off", "unset", "empty", "n/a",
                      "na", "tbd", "todo", "redacted", "hidden", "masked", "required", "optional", "disabled",
                      "enabled", "default", "undefined", "example", "expired", "invalid", "missing", "wrong",
                      "revoked", "rotated", "refreshed", "present", "absent", "valid", "denied", "incorrect",
                      "unknown", "blank", "generated", "provided", "error", "failed"}


def placeholder(value: str, name: str = "") -> bool:
    """A value that stands for a secret without being one. A value that ends in its own name is a variable
    passed on (`password=password`, `token = self.token`). Short values are memoized (`_short_placeholder`)."""
    if len(value) <= HEAD and len(name) <= HEAD:
        return _short_placeholder(value, name)
    return _placeholder(value, name)


# Hostile text repeats one name and value thousands of times (`pw: pw: pw: ...`): the pure judgments of short
# strings are memoized, so a repeat costs a lookup. Bounded caches, short strings only.
@lru_cache(maxsize=4096)
def _short_placeholder(value: str, name: str) -> bool:
    return _placeholder(value, name)


def _placeholder(value: str, name: str) -> bool:
    value = value.strip()
    low = value.lower()
    if not value or low in _PLACEHOLDER_WORDS or NOT_A_SECRET.match(value) or _REFERENCE.match(value):
        return True
    if not name:
        return False
    segment = _SEGMENT.split(name)[-1].lower()
    words = _WORD.findall(_SEGMENT.split(name)[-1])
    return low.rsplit(".", 1)[-1] in (segment, words[-1].lower() if words else segment)


_SYMBOLS = frozenset("!@#$%^&*+=/\\|?~<>()[]{}")  # not - . _ : , ' which words, versions and times hold


_LOWER, _UPPER, _DIGITS = re.compile(r"[a-z]"), re.compile(r"[A-Z]"), re.compile(r"[0-9]")
_SYMBOL = re.compile("[" + re.escape("".join(sorted(_SYMBOLS))) + "]")
_ALPHA = re.compile(r"[^\W\d_]")


def _looks_secret(value: str, length: int | None = None) -> bool:
    return _judge_looks_secret(value[:HEAD], len(value) if length is None else length)


@lru_cache(maxsize=4096)
def _judge_looks_secret(value: str, length: int) -> bool:
    """A bare word after `name:` is a secret only if it looks like one: `hunter2` does, `expired` does not.
    `value` may be the head of a longer value of `length` characters."""
    head, length = value[:HEAD], len(value) if length is None else length
    if not _ALPHA.search(head):
        return False  # 128/128, 12:30:00, 2026-03-02
    classes = (bool(_LOWER.search(head)) + bool(_UPPER.search(head, 1)) + bool(_DIGITS.search(head))
               + bool(_SYMBOL.search(head)))
    return length >= 6 and classes >= 2 or length >= 16 and "-" not in head


# --- Shapes: name=value pairs, Authorization headers ----------------------------------------------------

# name, an optional closing quote, the separator, then a quoted or a bare value (a bare one ends at ; or a
# quote), the value in a lookahead so that a pair inside a quoted value is seen too (value="...;Password=x").
_PAIR = re.compile(r"(?<![\w.$?&%/])([A-Za-z][\w.-]{0,80})(['\"]?)([ \t]*(?::=|=>|=(?![=~>])|:(?![:/\\]))[ \t]*)"
                   r"(?=(['\"`])(.{0,1024}?)\4|([^\s'\"`;]))")
_BARE_RUN = re.compile(r"[^\s'\"`;]*+")
# The word before a pair's name, read backwards from the name (one anchored match, not a search of a window).
_PREV_WORD_REVERSED = re.compile(r"[ \t]{1,8}([\w-]{0,38}[A-Za-z])(?![\w-])")


@lru_cache(maxsize=4096)
def _names_words(name: str) -> bool:
    return NAME_WORDS(name, name.lower())
_AUTH_HEADER = re.compile(
    r"(?<![\w-])(?:proxy-)?authorization['\"]?[ \t]*[:=][ \t]*['\"]?"
    r"(?:(bearer|basic|token|negotiate|ntlm|apikey|api-key|sso-key|key|jwt|dpop)[ \t]+)?([^\s'\",;]+)",
    re.IGNORECASE)
_BEARER = re.compile(r"(?<![\w-])[Bb]earer[ \t]+([A-Za-z0-9._~+/-]{16,}=*)")
_DIGIT = re.compile(r"\d")
_CLOSERS = {")": "(", "]": "[", "}": "{", ">": "<"}


def _strip_trailing(value: str) -> str:
    """A bare value without the sentence's punctuation after it: `hunter2.`, `(password=x)`, but `<your-key>`."""
    return _short_strip_trailing(value) if len(value) <= HEAD else _short_strip_trailing.__wrapped__(value)


@lru_cache(maxsize=4096)
def _short_strip_trailing(value: str) -> str:
    return value[:_stripped_end(value, 0, len(value), {o for o in _CLOSERS.values() if o in value})]


def _stripped_end(text: str, start: int, end: int, openers: set) -> int:
    while end > start and (text[end - 1] in ".," or text[end - 1] in _CLOSERS and _CLOSERS[text[end - 1]] not in openers):
        end -= 1
    return end


_OPENER, _NO_OPENERS = re.compile(r"[(\[{<]"), frozenset()


class _BareValues:
    """Where a bare value starting at a position ends (its run of value characters, without trailing
    punctuation). Pairs inside one run (`token:token:...`) share its end: the run is measured once, and its
    trailing punctuation stripped once per set of openers, so the values of a line cost linear time in all."""

    def __init__(self, text: str):
        self.text, self.run = text, (-1, -1)
        self.last: dict[str, int] = {}
        self.ends: dict[frozenset, int] = {}

    def end(self, start: int) -> int:
        if not self.run[0] <= start < self.run[1]:
            self.run = (start, _BARE_RUN.match(self.text, start).end())
            has = _OPENER.search(self.text, *self.run) is not None
            self.last = {o: self.text.rfind(o, *self.run) for o in _CLOSERS.values()} if has else {}
            self.ends = {}
        openers = frozenset(o for o, at in self.last.items() if at >= start) if self.last else _NO_OPENERS
        end = self.ends.get(openers)
        if end is None:
            end = self.ends[openers] = _stripped_end(self.text, start, self.run[1], set(openers))
        return max(start, end)


def _pair_findings(text: str) -> list[Finding]:
    """`name = value`, `name: value`, `"name": "value"` whose name names a secret: the value. A tight loop: hostile
    text holds a pair every few characters (`pw: pw: ...`)."""
    found, bare, reversed_text, at, size = [], _BareValues(text), None, 0, len(text)
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
        value = text[start:end] if end - start <= HEAD else text[start:start + HEAD]  # judged by its head
        if "[REDACTED:" in value or placeholder(value, name):
            continue
        if not quoted and ":" in sep and not _looks_secret(value, end - start):
            if kind != "password":
                continue
            phrase = _phrase_end(text, start)
            if phrase is not None:
                end = phrase  # `Password: correct horse battery staple`
            elif not _weak_password(_strip_trailing(value)):
                continue
        append(Finding(kind, start, end))
        if not quoted and end > at:  # a pair inside this bare value adds nothing the merge keeps (`token:token:...`)
            at = end
    return found


# Words that follow `password:` or `password is` in prose about a password, never as one.
_COMMON = set("""the a an in on at of to for and or not no is was are be been set see same new old ok okay fine
good bad weak strong secure insecure short long here there this that it now still also too only again reset change
changed stored kept saved sent shared known unchanged different right case policy manager field prompt below above
attached given pending needed ready your my our their his her its from with via by as will must should can cannot
what which who where when how why if then than so but all any some none both each every per please use used ask
asked do does did done has have had get got make made same vault file env environment prod production staging test
correctly incorrectly wrong expired rotated hashed salted encrypted auth authentication login logins protection
protected less free based only hash hint length strength complexity requirement requirements rule rules expiry history
reuse storage store generator form box dialog screen page link email flow update sync expire expires expiring rotate
rotates rotation one ones something someone default generated random stronger longer shorter temporary""".split())
_PROSE_ENDING = re.compile(r"[a-z]+(?:ed|ing|ly|ion|ions|ment|ness)")
_PHRASE_WORD = re.compile(r"[A-Za-z0-9!@#$%^&*+=-]{2,32}")


def _weak_password(value: str) -> bool:
    return len(value) <= HEAD and _short_weak_password(value)


@lru_cache(maxsize=4096)
def _short_weak_password(value: str) -> bool:
    """A one-word value under a password's name: even `admin` or `changeme` is somebody's password; a common word, a
    word that reads as a verb or adverb (`stored`, `rotating`), or a placeholder is not."""
    low = value.lower()
    return (3 <= len(value) <= HEAD and _ALPHA.search(value) is not None and low not in _COMMON
            and not _PROSE_ENDING.fullmatch(low) and not placeholder(value))


def _phrase_end(text: str, start: int) -> int | None:
    """The end of a passphrase that fills the rest of its line after `password:` (2 to 6 words, none common), or
    None. Looks at most HEAD characters."""
    if start + HEAD <= len(text) and text.find("\n", start, start + HEAD) < 0 and text.find(";", start, start + HEAD) < 0:
        return None  # the line goes on past HEAD: no phrase fills it (the common case, without copying it)
    line = text[start:start + HEAD].split("\n", 1)[0].split(";", 1)[0]
    if len(line) == HEAD:
        return None
    words = line.rstrip(" \t\r.,").split()
    if not 2 <= len(words) <= 6 or any(not _PHRASE_WORD.fullmatch(w) or w.lower() in _COMMON for w in words):
        return None
    return start + len(line.rstrip(" \t\r.,"))


# A secret named in prose, then its value (issue 37; issue 50: the verbs and contexts of typed passwords):
#   `password is hunter2xyz`, `the root password is changeme`, `the wifi password for the office is Sunflower42`,
#   `the passphrase is set to X`, `the password was changed to X`, `is now X`, `has been set to X` (a verb);
#   `set the root password to X`, `changed bob's password to X` (to, after set/change/reset/update/rotate);
#   `log in as ops with password X`, `with the passphrase 'blue river stone'`, `(password toor)`, `, password X`;
#   `aws secret access key wJalr...` (nothing: the word must look strongly like a secret).
# A secret-looking word, or a weak password (`toor`) that ends the clause; a quoted value whole.
_SAID = re.compile(r"(?<![A-Za-z])(password|passwd|passphrase|pwd|pw|secret|token|key|pat|credentials?)"
                   r"(?:[ \t]{1,8}for[ \t]{1,8}(?:(?:the|an?|our|my|his|her|their|new)[ \t]{1,8})?[\w-]{1,30})?"
                   r"(?:[ \t]{1,8}(is|was|has[ \t]{1,8}been|had[ \t]{1,8}been)(?:[ \t]{1,8}now)?)?"
                   r"(?:[ \t]{1,8}(?:(set|changed|reset|updated|rotated)[ \t]{1,8})?(to))?"
                   r"[ \t]{1,8}(?:(['\"])([^'\"\n]{3,128})\5|['\"]?([^\s'\"]{3,128}))", re.IGNORECASE)
# A word before a name, read backwards in the reversed text: one anchored match a word (five at most).
_WORD_BEFORE_REVERSED = re.compile(r"[ \t]{1,8}([\w'-]{0,30}[A-Za-z])(?![\w-])")
_CLAUSE_END = re.compile(r"['\"]?[ \t]*(?:$|[\r\n.,;!)]|(?:for|and|on|in|at|this|yesterday|today|now)\b)")
_SETTING = re.compile(r"(?:set|sets|setting|change|changed|changes|changing|reset|resets|update|updated|updates|"
                      r"rotate|rotated|rotates)")
_GIVING = {"with", "using", "use", "via"}  # `with password X`: the name, then its value


def _words_before(text: str, reversed_text: str, at: int) -> list[str]:
    """Up to five words before position `at`, in text order."""
    words, position = [], len(text) - at
    while len(words) < 5 and (m := _WORD_BEFORE_REVERSED.match(reversed_text, position)) is not None:
        words.append(m.group(1)[::-1])
        position = m.end()
    return words[::-1]


def _said_findings(text: str) -> list[Finding]:
    found, reversed_text = [], None
    for m in _SAID.finditer(text):
        reversed_text = text[::-1] if reversed_text is None else reversed_text
        before = _words_before(text, reversed_text, m.start())
        words = [w for w in before if w.lower() not in _COMMON and not _SETTING.fullmatch(w.lower())]
        name = "_".join(words[-2:] + [m.group(1)])
        kind = name_kind(name)
        quoted = m.group(6) is not None
        value = m.group(6) if quoted else _strip_trailing(m.group(7))
        start = m.start(6) if quoted else m.start(7)
        if kind is None or len(value) < 3 or placeholder(value, name) or value.lower() in _COMMON:
            continue
        end = start + len(value)
        ended = _CLAUSE_END.match(text, end) is not None
        weak = kind == "password" and _weak_password(value) and ended
        verb, to = m.group(2), m.group(4)
        gives = bool(before) and before[-1].lower() in _GIVING or \
            len(before) > 1 and before[-1].lower() == "the" and before[-2].lower() in _GIVING or \
            text[max(0, m.start() - 2):m.start()].rstrip()[-1:] in ("(", ",")
        if to and not verb and not m.group(3) and not any(_SETTING.fullmatch(w.lower()) for w in before):
            continue  # `sent the password to bob`: no setting verb, so `to` gives no value
        if verb or to or gives:
            ok = quoted and kind == "password" or _looks_secret(value) or weak
        else:
            ok = len(value) >= 12 and _looks_secret(value) and bool(_DIGITS.search(value)) and "-" not in value
        if ok:
            found.append(Finding(kind, start, end))
    return found


# `credentials: admin / Adm1nPw!`, `login alice/Hunter2x`: a user, a slash, a password.
_USER_SLASH = re.compile(r"(?<![A-Za-z])(?:credentials?|creds|login)[ \t]{0,8}[:=]?[ \t]{1,8}([\w.@-]{1,64})[ \t]{0,8}/"
                         r"[ \t]{0,8}([^\s'\"/]{3,128})", re.IGNORECASE)


def _user_slash_findings(text: str) -> list[Finding]:
    found = []
    for m in _USER_SLASH.finditer(text):
        value = _strip_trailing(m.group(2))
        end = m.start(2) + len(value)
        if len(value) >= 3 and not placeholder(value) and (
                _looks_secret(value) or _weak_password(value) and _CLAUSE_END.match(text, end) is not None):
            found.append(Finding("password", m.start(2), end))
    return found


# `memctl fact set db.password Hunter2xyz` typed into a note: the value of a fact whose key names a secret.
_FACT_SET = re.compile(r"(?<![\w-])fact[ \t]+set[ \t]+['\"]?([\w.:/-]{1,200})['\"]?[ \t]+"
                       r"(?:(['\"])(.{1,1024}?)\2|([^\s'\"]\S*+))")


def _fact_set_findings(text: str) -> list[Finding]:
    found = []
    for m in _FACT_SET.finditer(text):
        kind, group = name_kind(m.group(1)), 3 if m.group(3) is not None else 4
        if kind and len(m.group(group)) >= 3 and not placeholder(m.group(group), m.group(1)):
            found.append(Finding(kind, *m.span(group)))
    return found


def _header_findings(text: str, low: str) -> list[Finding]:
    found = []
    if "authorization" in low:
        for m in _AUTH_HEADER.finditer(text):
            value = _strip_trailing(m.group(2))
            if not placeholder(value) and len(value) >= 4 and (m.group(1) or _looks_secret(value)):
                found.append(Finding("authorization", m.start(2), m.start(2) + len(value)))
    if "earer " in text:
        found.extend(Finding("bearer-token", *m.span(1)) for m in _BEARER.finditer(text)
                     if _DIGIT.search(m.group(1)) and not placeholder(m.group(1)))
    return found


def shape_findings(text: str, low: str) -> list[Finding]:
    found = _header_findings(text, low)
    if named_pair(text, low):
        found.extend(_pair_findings(text))
    if NAME_WORDS(text, low):
        found.extend(_said_findings(text))
    if "/" in text and ("cred" in low or "login" in low):
        found.extend(_user_slash_findings(text))
    if "fact" in low and "set" in low:
        found.extend(_fact_set_findings(text))
    return found

