"""Passwords on command lines (memctl.redact's docstring): `mysql -pX`, `sshpass -p X`, `redis-cli -a X`,
`curl -u user:X`, `docker login -p X`, and `--password X` after any command; and (issue 50) a password a
command takes as a plain argument: an option's value (`sqlcmd -P X`, `zip -P X`, `keytool -storepass X`), a
place among its arguments (`htpasswd -b FILE USER X`, `net user NAME X`, `rabbitmqctl add_user USER X`,
`mysqladmin password X`, `redis-cli AUTH X`), or what is piped into it (`echo X | passwd --stdin`,
`echo user:X | chpasswd`, `echo X | sudo -S`). A `$VAR`, `$(cmd)` or `*` stands for one and stays.

Each command's line is read once, to a pipe, `;`, `&` or the line's end, as words (a quoted one whole): time
linear in the text.
"""

from __future__ import annotations

import re

from memctl.redact.names import Finding, name_kind, placeholder

# A password-taking command, then the rest of its command line (to a pipe, ; or &).
_PASSWORD_COMMAND = re.compile(
    r"(?<![\w./-])(mysql[\w-]*|mariadb[\w-]*|sshpass|redis-cli|curl|(?:docker|podman|nerdctl)[ \t]+login)\b([^\n|;&]*)"
)
_VALUE = r"(?:(['\"])(.{0,1024}?)\1|([^\s'\"]\S*+))"
_COMMAND_PASSWORD = {
    "mysql": re.compile(r"(?<=\s)-p" + _VALUE),  # attached only: `mysql -p` alone prompts
    "sshpass": re.compile(r"(?<=\s)-p[ \t]*" + _VALUE),
    "redis-cli": re.compile(r"(?<=\s)(?:-a|--pass)[ \t]+" + _VALUE),
    "login": re.compile(r"(?<=\s)(?:-p|--password)(?:[ \t]+|=)" + _VALUE),  # docker login -p
    "curl": re.compile(r"(?<=\s)(?:-u|--user)[ \t]*['\"]?[^\s:'\"]+:" + r"([^\s'\"]+)"),
}

# Commands whose password is one of their arguments: the options that take it (the value after a blank, or
# attached to a one-letter option), or a rule for its place (_PLACED).
_TAKES = {
    "sqlcmd": ("-P",),
    "bcp": ("-P",),
    "ipmitool": ("-P",),
    "zip": ("-P",),
    "unzip": ("-P",),
    "ldapsearch": ("-w",),
    "ldapadd": ("-w",),
    "ldapmodify": ("-w",),
    "ldapdelete": ("-w",),
    "ldapwhoami": ("-w",),
    "ldappasswd": ("-w", "-s", "-a"),
    "ssh-keygen": ("-N", "-P"),
    "useradd": ("-p",),
    "usermod": ("-p",),
    "mongo": ("-p",),
    "mongosh": ("-p",),
    "az": ("-p",),
    "7z": ("-p",),
    "7za": ("-p",),
    "keytool": (
        "-storepass",
        "-keypass",
        "-srcstorepass",
        "-deststorepass",
        "-srckeypass",
        "-destkeypass",
        "-new",
    ),
    "smbclient": ("-U",),
    "rpcclient": ("-U",),
    "smbmap": ("-p",),
}
_ATTACHED_ONLY = {"7z", "7za"}  # `7z a -pX`: a blank after -p is another argument
_PLACED = {"htpasswd", "net", "rabbitmqctl", "mysqladmin", "redis-cli"}
_ARGUMENT_COMMAND = re.compile(
    r"(?<![\w./-])("
    + "|".join(sorted(map(re.escape, {*_TAKES, *_PLACED}), key=len, reverse=True))
    + r")(?![\w.-])([^\n|;&]*)"
)
_WORDS = re.compile(r"(['\"])(.{0,1024}?)\1|[^\s'\"]\S*+")
# `echo X | passwd --stdin`, `printf 'user:X' | chpasswd`, `echo X | sudo -S ...`: what is echoed into them.
_PIPED = re.compile(
    r"(?<![\w./-])(?:echo|printf)(?:[ \t]{1,8}-[neE]{1,3})*[ \t]{1,8}(?:(['\"])(.{1,512}?)\1|"
    r"([^\s'\"|;&]{1,512}))[ \t]{0,8}\|[ \t]{0,8}(?:sudo[ \t]{1,8}(?:-\w+[ \t]{1,8})*)?"
    r"(chpasswd|passwd[ \t]{1,8}--stdin|passwd|sudo[ \t]{1,8}-S|-S)(?![\w-])"
)


def command_words(text: str, low: str) -> bool:
    return (
        "mysql" in low
        or "login" in low
        and "-p" in text
        or "fact" in low
        and "set" in low
        or "mariadb" in low
        or "sshpass" in low
        or "redis-cli" in low
        or "curl" in low
        and ("-u" in text or "--user" in text)
        or "passw" in low
        or "net us" in low
        or "rabbitmqctl" in low
        or "|" in text
        and "sudo" in low
        or " -" in text
        and _ARGUMENT_COMMAND.search(text) is not None
    )


_OPTION = re.compile(
    r"(?<![\w-])--([A-Za-z][\w-]{1,40})[ \t]+(?:(['\"])(.{0,1024}?)\2|([^\s'\"-]\S*+))"
)


def command_findings(text: str) -> list[Finding]:
    """Passwords on command lines: mysql -pX, sshpass -p X, redis-cli -a X, curl -u user:X, --password X, and
    those a command takes as a plain argument or from a pipe (the module's docstring)."""
    found = []
    for command in _PASSWORD_COMMAND.finditer(text):
        name = command.group(1)
        rule = _COMMAND_PASSWORD[
            "mysql"
            if name.startswith(("mysql", "mariadb"))
            else "login"
            if name.endswith("login")
            else name
        ]
        for m in rule.finditer(text, command.start(2), command.end(2)):
            assert m.lastindex is not None  # each rule's value is a group
            span = (m.start(m.lastindex), m.end(m.lastindex))
            value = text[span[0] : span[1]]
            if (
                len(value) < 3
                or placeholder(value)
                or name[0] == "m"
                and value.isdigit()
                and len(value) <= 5
            ):
                continue  # `mysql -p3306`: a port typed with the wrong case; `-pv` another command's flags
            found.append(Finding("password", *span))
    if "--" in text:
        for m in _OPTION.finditer(text):
            kind = name_kind(m.group(1))
            group = 3 if m.group(3) is not None else 4
            value = m.group(group)
            if kind and len(value) >= 3 and "=" not in value and not placeholder(value, m.group(1)):
                found.append(Finding(kind, *m.span(group)))
    found.extend(_argument_findings(text))
    if "|" in text:
        found.extend(_piped_findings(text))
    return found


def _argument_findings(text: str) -> list[Finding]:
    found = []
    for command in _ARGUMENT_COMMAND.finditer(text):
        name = command.group(1)
        words = [
            (m.start(2), m.end(2)) if m.group(1) else m.span()
            for m in _WORDS.finditer(text, command.start(2), command.end(2))
        ]
        spans = _placed(name, text, words) if name in _PLACED else _option_values(name, text, words)
        for start, end in spans:
            value = text[start:end]
            if (
                len(value) >= 3
                and value != "*"
                and not value.startswith("$")
                and not placeholder(value)
            ):
                found.append(Finding("password", start, end))
    return found


def _option_values(name: str, text: str, words: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The values of the options of _TAKES[name]: `-P X` or `-PX` (a one-letter option), `-storepass X`."""
    spans = []
    for i, (start, end) in enumerate(words):
        word = text[start:end]
        for option in _TAKES[name]:
            if word == option and name not in _ATTACHED_ONLY and i + 1 < len(words):
                following = words[i + 1]
                if not text.startswith("-", following[0]):  # `mongosh -p --db x`: it prompts
                    spans.append(following)
            elif len(option) == 2 and word.startswith(option) and len(word) > 2:
                spans.append((start + 2, end))
    if name in ("smbclient", "rpcclient"):  # -U user%password
        spans = [
            (start + text.index("%", start, end) + 1 - start, end)
            for start, end in spans
            if "%" in text[start:end]
        ]
    return spans


def _placed(name: str, text: str, words: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The password by its place among the arguments (_PLACED)."""
    said = [text[s:e] for s, e in words]
    low = [w.lower() for w in said]
    plain = [i for i, w in enumerate(said) if not w.startswith(("-", "/"))]
    if name == "htpasswd":  # -b: FILE USER PASSWORD; -nb: USER PASSWORD (on stdout)
        options = "".join(w for w in said if w.startswith("-"))
        place, given = (
            1 if "n" in options else 2,
            [i for i, w in enumerate(said) if not w.startswith("-")],
        )
        return [words[given[place]]] if "b" in options and len(given) > place else []
    if name == "net" and low[:1] in (
        ["user"],
        ["use"],
    ):  # net user NAME PASSWORD, net use [D:] \\host\share PASSWORD
        rest = plain[1:]
        if low[0] == "use":
            share = next((n for n, i in enumerate(rest) if said[i].startswith("\\\\")), None)
            rest = rest[share + 1 :] if share is not None else []
            return [words[rest[0]]] if rest else []
        return [words[rest[1]]] if len(rest) > 1 else []
    if name == "rabbitmqctl" and low[:1] in (["add_user"], ["change_password"]) and len(plain) > 2:
        return [words[plain[2]]]
    if name == "mysqladmin" and "password" in low:
        at = low.index("password") + 1
        return [words[at]] if at < len(words) and not said[at].startswith("-") else []
    if name == "redis-cli":  # AUTH [USER] PASSWORD, CONFIG SET requirepass|masterauth PASSWORD
        for keyword, offset in (("auth", None), ("requirepass", 1), ("masterauth", 1)):
            if keyword in low:
                at = low.index(keyword)
                after = [
                    i for i in range(at + 1, min(at + 3, len(words))) if not said[i].startswith("-")
                ]
                if after:
                    return [words[after[-1] if offset is None else after[0]]]
    return []


def _piped_findings(text: str) -> list[Finding]:
    found = []
    for m in _PIPED.finditer(text):
        group = 2 if m.group(2) is not None else 3
        start, end = m.span(group)
        if m.group(4) == "chpasswd":  # user:password (entries split by \n in an echo -e)
            colon = text.find(":", start, end)
            start = colon + 1 if colon >= 0 else end
        value = text[start:end]
        if len(value) >= 3 and not value.startswith("$") and not placeholder(value):
            found.append(Finding("password", start, end))
    return found
