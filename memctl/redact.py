"""Secrets never enter memory: find them in a text and replace each with `[REDACTED:<kind>]`.

Detection is detect-secrets' regex plugins (GitHub, AWS, Slack, Stripe, JWT, private key
headers, quoted `password = "..."` keywords, ...) plus what they miss that matters here:
credentials inside URLs (the same rules as config.mask_secrets), whole PEM/OpenSSH private
key blocks (detect-secrets flags only the BEGIN line), and the shapes operators paste every
day (issue 19):

- a pair whose name names a secret (`secret_name`): `db password: hunter2`,
  `export AWS_SECRET_ACCESS_KEY=...`, `"client_secret": "..."`, `PGPASSWORD=...`,
  `--password hunter2`. Only the value is replaced (`db password: [REDACTED:password]`).
  After `=` or in quotes any value counts; a bare value after `:` must look like one (6+
  characters mixing two of lower case, inner upper case, digits, symbols; or 16+ without a
  hyphen), so `token: expired, log in again` stays prose.
- `Authorization:` headers (Bearer, Basic, Token, ...) and a lone `Bearer <16+ chars>`.
- passwords on command lines: `mysql -phunter2` (and mariadb, mysqldump...; a bare number
  of up to 5 digits is taken for a mistyped port), `sshpass -p`, `redis-cli -a`,
  `curl -u user:password`. `ls -p`, `mkdir -p`, `ssh -p 2222` name no such command.
- provider key prefixes (`_PROVIDER_KEYS`): OpenAI `sk-`/`sk-proj-`, Anthropic `sk-ant-`,
  GitHub `github_pat_`, Google `AIza`, Hugging Face `hf_`, npm, Groq, Vault, ..., each with
  the length of a real key.

A value that is a placeholder or a reference is not a secret and stays (`_placeholder`):
`***`, `xxx`, `<password>`, `${VAR}`, `$VAR`, `$(cmd)`, `{{ var }}`, `%VAR%`, a marker, a
path (`/run/secrets/db`, `~/.pgpass`), a secret-store reference (`op://`, `vault:`, an AWS
secretsmanager/ssm ARN) and words such as none, null, true, unset, required. `changeme`,
`password` and `secret` are NOT placeholders: they are the real (weak) password of the
system that uses them.

Left out on purpose, because operators write these every day and memory full of markers
is broken memory: the high-entropy plugins (they fire on commit ids, sha256 sums and
UUIDs), the public-IP plugin, and Basic Auth (replaced by the URL rule, which also masks
the password of a URL whose password holds reserved characters).
tests/data/secrets_labelled.jsonl proves both sides.

Each plugin's own analyze_string runs once over the whole text (the keyword plugin per
line), so its validity checks apply (a JWT must decode); the values it reports are then
located in the text. Every detector sits behind a cheap substring gate, and a text with no
run of 16 token characters, no `://`, no quote, no secret-like word next to a `=` or `:`
and no password-taking command skips them all (`_candidate`), which is most prose.

A field or fact whose name names a secret (`secret_name`: `db.password`, `api_token`) is
replaced whole by `Redactor.named` / `redact_value` (kind `secret-named`, or the detector's
kind when the value is one known secret), unless it is a placeholder or reads as a sentence
(has a space and a common word: "rotated, see the vault"), which is scanned like any text;
a number or boolean under such a name is left as it is.
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
# ?password=... / ?token=... in a URL's query string (a libpq password=... pair is a name=value pair: _PAIR).
_QUERY_SECRET = re.compile(
    r"[?&](?:(?:ssl)?(?:password|passwd|pwd)|token|api[_-]?key|access[_-]?token|secret)=([^&#\s'\"]+)", re.IGNORECASE)
# Per plugin, a cheap test that every match of its patterns implies (a keyword, a prefix, a
# quote), on the text and its lower-case copy: a plugin whose gate fails is not run. Plain
# substring tests, because Python's re is slow on case-insensitive alternations (measured:
# 30-40 us per 300-character line for each such gate as a regex; the keyword plugin itself
# costs 230 us).
_QUOTED = re.compile(r"['\"`]")


def _any(*words: str):
    return lambda text, low: any(w in low for w in words)


GATES = {
    # the plugin (230 us a line) needs a quote and one of its DENYLIST words
    "secret-keyword": lambda text, low: (_QUOTED.search(text) is not None
                                         and any(w in low for w in ("key", "pass", "pwd", "secret", "contrase"))),
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
_KEYWORDS = _any("key", "pw", "pass", "token", "secret", "cloudant", "auth", "bearer")


def _candidate(text: str, low: str) -> bool:
    """Could any detector match at all? A long token, a URL, a key line, a quote, a secret-like name before
    `=` or `:`, or a command that takes a password."""
    if "://" in text or "private key" in low or "putty" in low or "password" in low or _QUOTED.search(text):
        return True
    if ("=" in text or ":" in text) and _NAME_WORDS(text, low) or _command_words(text, low):
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


# --- Names that name a secret ---------------------------------------------------------------------------

_SEGMENT = re.compile(r"[./:\\]")
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
# The last word of the name decides: password-like words give the kind "password", the rest "secret-keyword".
_SECRET_SUFFIXES = (("password", "password"), ("passwd", "password"), ("passphrase", "password"),
                    ("secret", "secret-keyword"), ("token", "secret-keyword"), ("apikey", "secret-keyword"),
                    ("secretkey", "secret-keyword"), ("accesskey", "secret-keyword"),
                    ("privatekey", "secret-keyword"), ("authkey", "secret-keyword"))
_SECRET_WORDS = {"pwd": "password", "pass": "password", "credential": "secret-keyword",
                 "credentials": "secret-keyword"}
# "key" alone names a secret only after one of these (api key, AWS_SECRET_ACCESS_KEY); not ssh, primary,
# public, sort, partition, cache, idempotency keys.
_KEY_MODIFIERS = {"api", "access", "secret", "private", "client", "auth", "encryption", "signing", "master",
                  "service", "account", "app", "license", "db", "database", "priv", "hmac", "shared", "webhook",
                  "subscription", "openai", "anthropic", "stripe", "sendgrid", "mailgun", "twilio"}
# A token counted, paged or spliced into a prompt is no credential (max_tokens, page token, eos_token).
_TOKEN_NOT = {"max", "min", "num", "total", "input", "output", "prompt", "completion", "page", "next", "continuation",
              "cursor", "sync", "eos", "bos", "pad", "unk", "sep", "cls", "mask", "special", "stop", "start", "end",
              "first", "last", "per", "context"}
_NAME_WORDS = _any("pass", "pwd", "secret", "token", "key", "auth", "credential")


def _name_kind(name: str) -> str | None:
    """The kind of secret a field, fact key or variable name names, or None."""
    words = [w.lower() for w in _WORD.findall(_SEGMENT.split(name.strip())[-1])]
    while words and words[-1].isdigit():
        words.pop()
    if not words:
        return None
    last, before = words[-1], words[-2] if len(words) > 1 else ""
    if last == "key":
        return "secret-keyword" if before in _KEY_MODIFIERS else None
    if last == "auth":
        return "secret-keyword" if before in ("basic", "http", "proxy") else None
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
    return _name_kind(name) is not None


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


def _placeholder(value: str, name: str = "") -> bool:
    """A value that stands for a secret without being one. A value that ends in its own name is a variable
    passed on (`password=password`, `token = self.token`)."""
    value = value.strip()
    low = value.lower()
    if not value or low in _PLACEHOLDER_WORDS or _NOT_A_SECRET.match(value) or _REFERENCE.match(value):
        return True
    if not name:
        return False
    segment = _SEGMENT.split(name)[-1].lower()
    words = _WORD.findall(_SEGMENT.split(name)[-1])
    return low.rsplit(".", 1)[-1] in (segment, words[-1].lower() if words else segment)


_SYMBOLS = frozenset("!@#$%^&*+=/\\|?~<>()[]{}")  # not - . _ : , ' which words, versions and times hold


def _looks_secret(value: str) -> bool:
    """A bare word after `name:` is a secret only if it looks like one: `hunter2` does, `expired` does not."""
    classes = (any(c.islower() for c in value) + any(c.isupper() for c in value[1:])
               + any(c.isdigit() for c in value) + any(c in _SYMBOLS for c in value))
    if not any(c.isalpha() for c in value):
        return False  # 128/128, 12:30:00, 2026-03-02
    return len(value) >= 6 and classes >= 2 or len(value) >= 16 and "-" not in value


# --- Shapes: name=value pairs, Authorization headers, command-line passwords, provider keys ----------------

# name, an optional closing quote, the separator, then a quoted or a bare value (a bare one ends at ; or a
# quote), the value in a lookahead so that a pair inside a quoted value is seen too (value="...;Password=x").
_PAIR = re.compile(r"(?<![\w.$?&%/])([A-Za-z][\w.-]{0,80})(['\"]?)([ \t]*(?::=|=>|=(?![=~>])|:(?![:/\\]))[ \t]*)"
                   r"(?=(['\"`])(.*?)\4|([^\s'\"`;]+))")
_PREV_WORD = re.compile(r"([A-Za-z][\w-]*)[ \t]+$")
_AUTH_HEADER = re.compile(
    r"(?<![\w-])(?:proxy-)?authorization['\"]?[ \t]*[:=][ \t]*['\"]?"
    r"(?:(bearer|basic|token|negotiate|ntlm|apikey|api-key|sso-key|key|jwt|dpop)[ \t]+)?([^\s'\",;]+)",
    re.IGNORECASE)
_BEARER = re.compile(r"(?<![\w-])[Bb]earer[ \t]+([A-Za-z0-9._~+/-]{16,}=*)")
# A password-taking command, then the rest of its command line (to a pipe, ; or &).
_PASSWORD_COMMAND = re.compile(r"(?<![\w./-])(mysql[\w-]*|mariadb[\w-]*|sshpass|redis-cli|curl)\b([^\n|;&]*)")
_VALUE = r"(?:(['\"])(.*?)\1|([^\s'\"]\S*))"
_COMMAND_PASSWORD = {
    "mysql": re.compile(r"(?<=\s)-p" + _VALUE),  # attached only: `mysql -p` alone prompts
    "sshpass": re.compile(r"(?<=\s)-p[ \t]*" + _VALUE),
    "redis-cli": re.compile(r"(?<=\s)(?:-a|--pass)[ \t]+" + _VALUE),
    "curl": re.compile(r"(?<=\s)(?:-u|--user)[ \t]*['\"]?[^\s:'\"]+:" + r"([^\s'\"]+)"),
}


def _command_words(text: str, low: str) -> bool:
    return ("mysql" in low or "mariadb" in low or "sshpass" in low or "redis-cli" in low
            or "curl" in low and ("-u" in text or "--user" in text))


_OPTION = re.compile(r"(?<![\w-])--([A-Za-z][\w-]{1,40})[ \t]+(?:(['\"])(.*?)\2|([^\s'\"-]\S*))")

# Provider keys by prefix: (kind, literal prefix for the gate, pattern). The body must hold a digit and a letter.
_PROVIDER_KEYS = tuple((kind, prefix, re.compile(r"(?<![\w-])" + pattern + r"(?![\w-])")) for kind, prefix, pattern in (
    ("anthropic-api-key", "sk-ant-", r"sk-ant-[A-Za-z0-9_-]{32,}"),
    ("openai-token", "sk-", r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}"),
    ("github-token", "github_pat_", r"github_pat_[A-Za-z0-9_]{30,}"),
    ("google-api-key", "AIza", r"AIza[0-9A-Za-z_-]{35}"),
    ("huggingface-token", "hf_", r"hf_[A-Za-z0-9]{30,}"),
    ("npm-tokens", "npm_", r"npm_[A-Za-z0-9]{36}"),
    ("groq-api-key", "gsk_", r"gsk_[A-Za-z0-9]{40,}"),
    ("xai-api-key", "xai-", r"xai-[A-Za-z0-9]{60,}"),
    ("perplexity-api-key", "pplx-", r"pplx-[A-Za-z0-9]{40,}"),
    ("replicate-token", "r8_", r"r8_[A-Za-z0-9]{37}"),
    ("vault-token", "hv", r"hv[sbr]\.[A-Za-z0-9_-]{24,}"),
    ("digitalocean-token", "_v1_", r"do[opr]_v1_[a-f0-9]{64}"),
    ("databricks-token", "dapi", r"dapi[a-f0-9]{32}(?:-\d)?"),
    ("shopify-token", "shp", r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}"),
    ("linear-api-key", "lin_api_", r"lin_api_[A-Za-z0-9]{40}"),
    ("postman-api-key", "PMAK-", r"PMAK-[a-f0-9]{24}-[a-f0-9]{34}"),
    ("stripe-access-key", "_test_", r"(?:sk|rk)_test_[A-Za-z0-9]{24,}"),
    ("stripe-access-key", "whsec_", r"whsec_[A-Za-z0-9]{32,}"),
))
_DIGIT, _LETTER = re.compile(r"\d"), re.compile(r"[A-Za-z]")


def _provider_findings(text: str) -> list[Finding]:
    found = []
    for kind, prefix, pattern in _PROVIDER_KEYS:
        if prefix in text:
            for m in pattern.finditer(text):
                body = m.group()[len(prefix):] if m.group().startswith(prefix) else m.group()
                if _DIGIT.search(body) and _LETTER.search(body):
                    found.append(Finding(kind, *m.span()))
    return found


def _value_span(m: re.Match, quoted: int, bare: int) -> tuple[int, int, bool]:
    """(start, end, was quoted) of a quoted or a bare value group; trailing punctuation is not part of a bare one."""
    if m.group(quoted) is not None:
        return m.start(quoted), m.end(quoted), True
    start, end = m.span(bare)
    return start, start + len(_strip_trailing(m.group(bare))), False


_CLOSERS = {")": "(", "]": "[", "}": "{", ">": "<"}


def _strip_trailing(value: str) -> str:
    """A bare value without the sentence's punctuation after it: `hunter2.`, `(password=x)`, but `<your-key>`."""
    while value and (value[-1] in ".," or value[-1] in _CLOSERS and _CLOSERS[value[-1]] not in value):
        value = value[:-1]
    return value


def _pair_findings(text: str) -> list[Finding]:
    """`name = value`, `name: value`, `"name": "value"` whose name names a secret: the value."""
    found = []
    for m in _PAIR.finditer(text):
        name = m.group(1)
        if not _NAME_WORDS(name, name.lower()):
            continue
        if "." not in name:
            prev = _PREV_WORD.search(text, max(0, m.start() - 40), m.start())
            name = f"{prev.group(1)}_{name}" if prev else name
        kind = _name_kind(name)
        if kind is None or m.group(4) == "`":
            continue
        sep = m.group(3)
        if sep.lstrip().startswith("=") and sep.endswith((" ", "\t")) and not sep.startswith((" ", "\t")):
            continue  # `PGPASSWORD= psql`: an empty assignment before a command
        start, end, quoted = _value_span(m, 5, 6)
        value = text[start:end]
        if _placeholder(value, m.group(1)) or "[REDACTED:" in value or len(value) < 3:
            continue
        if not quoted and ":" in sep and not _looks_secret(value):
            continue
        found.append(Finding(kind, start, end))
    return found


def _header_findings(text: str, low: str) -> list[Finding]:
    found = []
    if "authorization" in low:
        for m in _AUTH_HEADER.finditer(text):
            value = _strip_trailing(m.group(2))
            if not _placeholder(value) and len(value) >= 4 and (m.group(1) or _looks_secret(value)):
                found.append(Finding("authorization", m.start(2), m.start(2) + len(value)))
    if "earer " in text:
        found.extend(Finding("bearer-token", *m.span(1)) for m in _BEARER.finditer(text)
                     if _DIGIT.search(m.group(1)) and not _placeholder(m.group(1)))
    return found


def _command_findings(text: str) -> list[Finding]:
    """Passwords on command lines: mysql -pX, sshpass -p X, redis-cli -a X, curl -u user:X, --password X."""
    found = []
    for command in _PASSWORD_COMMAND.finditer(text):
        name = command.group(1)
        rule = _COMMAND_PASSWORD["mysql" if name.startswith(("mysql", "mariadb")) else name]
        for m in rule.finditer(text, command.start(2), command.end(2)):
            span = (m.start(m.lastindex), m.end(m.lastindex))
            value = text[span[0]:span[1]]
            if len(value) < 3 or _placeholder(value) or name[0] == "m" and value.isdigit() and len(value) <= 5:
                continue  # `mysql -p3306`: a port typed with the wrong case; `-pv` another command's flags
            found.append(Finding("password", *span))
    if "--" in text:
        for m in _OPTION.finditer(text):
            kind = _name_kind(m.group(1))
            group = 3 if m.group(3) is not None else 4
            value = m.group(group)
            if kind and len(value) >= 3 and "=" not in value and not _placeholder(value, m.group(1)):
                found.append(Finding(kind, *m.span(group)))
    return found


def _shape_findings(text: str, low: str) -> list[Finding]:
    found = _header_findings(text, low)
    if _command_words(text, low) or "--" in text:
        found.extend(_command_findings(text))
    if ("=" in text or ":" in text) and _NAME_WORDS(text, low):
        found.extend(_pair_findings(text))
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
    # In this order, because the first of two findings with the same span names it: a provider's key
    # before the plugins' guesses (an IBM "key" of 44 characters), both before a secret-like name.
    found.extend(_provider_findings(text))
    found.extend(_plugin_findings(text, low))
    found.extend(_shape_findings(text, low))
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


NAMED = "secret-named"
# A value with a space and one of these reads as a sentence about the secret ("rotated, see the vault"),
# not as a passphrase, and is scanned like any text.
_PROSE_WORDS = {"the", "a", "an", "see", "in", "is", "was", "on", "at", "of", "to", "from", "for", "and", "or",
                "via", "use", "used", "stored", "rotated", "moved", "ask", "set", "not", "no", "by", "with"}


def _named_secret(name: str, value: str) -> bool:
    """Is this value, under this name, a secret to replace whole? Not a placeholder, not a sentence."""
    if not secret_name(name) or _placeholder(value, name):
        return False
    words = set(re.findall(r"[a-z]+", value.lower())) if re.search(r"\s", value.strip()) else set()
    return not words & _PROSE_WORDS


def _whole(value: str) -> tuple[str, Counter]:
    """A secret-named value replaced whole: by its own kind's marker when it is one secret a detector knows
    (a GitHub token under deploy.token), else by `[REDACTED:secret-named]`."""
    found = find(value)
    if len(found) == 1 and not value[:found[0].start].strip() and not value[found[0].end:].strip():
        return MARKER.format(found[0].kind), Counter({found[0].kind: 1})
    return MARKER.format(NAMED), Counter({NAMED: 1})


def redact_named(name: str, value: str | None, text: Callable[[str], str | None] | None = None) -> str | None:
    """A value stored under a name: replaced whole (`_whole`) when the name names a secret (`secret_name`) and
    the value is neither a placeholder nor a sentence, else passed through `text` (default redact_text)."""
    if not value:
        return value
    if _named_secret(name, value):
        return _whole(value)[0]
    return (text or redact_text)(value)


def redact_value(value: Any, text: Callable[[str], str | None] | None = None,
                 named: Callable[[str, str], str | None] | None = None) -> Any:
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
        self._allow(what, kinds)
        self.kinds.update(kinds)
        return replace(value, found)

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
        return redact_value(value, lambda item: self.text(item, what), lambda key, item: self.named(key, item, what))

    def _allow(self, what: str, kinds: Counter) -> None:
        if self.mode == "block":
            raise SecretRefused(f"refused: the {what} holds {sum(kinds.values())} secret(s) ({kinds_text(kinds)}); "
                                '[redaction] mode = "block" refuses such writes: remove the secret, or set '
                                'mode = "redact" to store it as a [REDACTED:<kind>] marker')

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
