"""Redaction's rate on hostile and on everyday text, and both sides of what it catches (issue 37).

Printed: MB/s of `redact.find` on a realistic mix (the clean corpus of tests/redaction_shapes.py, with the
listed secret shapes sprinkled in, joined into records of a few KB) and on each adversarial shape of
--size characters, the worst of them named (goal: both >= 1 MB/s on one core); beside each, a plain
baseline measured in the same run (`str.lower` and one `re.finditer` over the same text) so a slow
machine reads as a ratio too. Times are this process's CPU time (one core's work, whatever else the
machine runs; the fastest of --runs). `--search N` also tries N random shapes of 1 to 5 pieces (the
listed shapes and the pieces of the linear-time property) at a tenth of --size and names the slowest.
Then the share of listed secret shapes caught (goal: all) and the share of clean records altered (goal
<= 0.5%): the LoCoMo dev turns (../shared/eval, when present), the retrieval test data and the labelled
everyday lines; and the labelled lines by shape (argument, prose, other): secrets caught, everyday lines altered.

    python tests/bench/redact.py [--size 200000] [--runs 3] [--search 0] [--seed 1]
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from memctl import redact  # noqa: E402
from tests.redaction_shapes import PIECES, SECRETS, clean_corpus  # noqa: E402

ADVERSARIAL = [
    "token:",
    "password=",
    "pw: ",
    "db password: Hunter2x ",
    "api_key='",
    'secret = "',
    "'",
    '"',
    "Bearer ",
    "Bearer abcdefghijklmnopqrstu1 ",
    "QUJDREVGR0hJSktM",
    "0123456789abcdef",
    "([{",
    ")]}",
    "eyJ",
    "eyJhbGciOi.",
    "ghp_",
    "AKIA",
    "glpat-",
    "sk-",
    "http://u:",
    "a://b:c@",
    "?token=",
    "-----BEGIN PRIVATE KEY-----\n",
    "mysql -pabc ",
    "curl -u a:",
    "--password ",
    "password is ",
    "aws secret access key ",
    "fact set db.pw ",
    "key ",
    "docker login -p x ",
    # found since (issue 37): the keyword plugin's patterns, its Cloudant/IBM kin, pairs every few characters
    "pwd';",
    "pwd'x';",
    "password: '",
    "'a'=='b'!=",
    "aws key '",
    "pw: a",
    "pw: secret ;",
    "token: a. ",
    "pw: " + "a" * 64 + " ",
    "cl_key: abcdefghijklmnopqrstuvwx ",
    "key=" + "0123456789abcdef" * 4 + ";",
    "authorization: ",
    "https://a:b@c:d@",
    "token:(a)(b)[c]{d}<e>",
    "-----END PRIVATE KEY-----",
    "password is password is ",
    "passphrase: ",
    "contraseña='",
    "pwdpwdpwd';`",
    "+/!=`db_pass=aws ",
    "aws pw: ",
    "pwd';`",
    # numbered: each repeat holds another value ({i}), so no judgment of a repeated value is reused
    "pwd'{i}';\n",
    "api_key='{i}'\n",
    "'{i}' == pwd\n",
    'secret = "{i}"\n',
    "pw: {i} ",
    "password: a{i} ",
]
_WORDS = re.compile(r"\w+")


def best(fn, text: str, runs: int) -> float:
    """The fastest of `runs` calls, in CPU seconds of this process."""
    fastest = float("inf")
    for _ in range(runs):
        started = time.process_time()
        fn(text)
        fastest = min(fastest, time.process_time() - started)
    return max(fastest, 1e-6)


def rate(text: str, runs: int) -> tuple[float, float]:
    """(MB/s of find, ratio of find's time to a plain regex pass over the same text)."""
    spent = best(redact.find, text, runs)
    plain = best(lambda t: (t.lower(), sum(1 for _ in _WORDS.finditer(t))), text, runs)
    return len(text.encode()) / spent / 1e6, spent / plain


def realistic(clean: list[str], size: int) -> list[str]:
    """Records of about 2 KB from the clean corpus, one listed secret shape in every fifth, to `size` in all."""
    records, record, total, i = [], [], 0, 0
    while total < size:
        line = clean[i % len(clean)]
        if i % 25 == 0:
            line += " " + SECRETS[(i // 25) % len(SECRETS)][0]
        record.append(line)
        total += len(line) + 1
        i += 1
        if sum(map(len, record)) > 2000:
            records.append("\n".join(record))
            record = []
    return records + (["\n".join(record)] if record else [])


def repeat(shape: str, size: int) -> str:
    """The shape repeated to `size` characters; `{i}` in it numbered 0, 1, 2, ..."""
    if "{i}" not in shape:
        return shape * (size // len(shape) + 1)
    pieces, total, i = [], 0, 0
    while total < size:
        pieces.append(shape.replace("{i}", str(i)))
        total, i = total + len(pieces[-1]), i + 1
    return "".join(pieces)


def search(count: int, seed: int, size: int, runs: int) -> list[tuple[float, float, str]]:
    """`count` random shapes of 1 to 5 pieces, each repeated to `size` characters: (MB/s, ratio, shape), slowest first."""
    pieces, rng, rates = sorted(set(ADVERSARIAL + PIECES)), random.Random(seed), []
    for _ in range(count):
        shape = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 5)))
        rates.append((*rate(repeat(shape, size), runs), shape))
    return sorted(rates)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--size", type=int, default=200_000, help="characters per adversarial text and of the mix"
    )
    p.add_argument("--runs", type=int, default=3)
    p.add_argument(
        "--search", type=int, default=0, help="random shapes to try besides the listed ones"
    )
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    redact.find("warm up password='x' token: abc")
    clean = clean_corpus()

    mix = realistic(clean, a.size)
    started = time.process_time()
    for record in mix:
        redact.find(record)
    spent = max(time.process_time() - started, 1e-6)
    mix_mb = sum(len(r.encode()) for r in mix) / 1e6
    print(
        f"realistic mix: {len(mix)} records, {mix_mb * 1e3:.0f} KB: {mix_mb / spent:.2f} MB/s (goal >= 1)"
    )

    rates = []
    for shape in ADVERSARIAL:
        mbs, ratio = rate(repeat(shape, a.size), a.runs)
        rates.append((mbs, ratio, shape))
    for mbs, ratio, shape in sorted(rates)[:5]:
        print(f"  {shape!r:34} {mbs:6.2f} MB/s, {ratio:6.1f}x a plain regex pass")
    worst = min(rates)
    print(f"worst shape {worst[2]!r} to {a.size} characters: {worst[0]:.2f} MB/s (goal >= 1)")
    if a.search:
        searched = search(a.search, a.seed, max(1000, a.size // 10), a.runs)
        print(
            f"searched {a.search} random shapes at {max(1000, a.size // 10)} characters; the slowest:"
        )
        for mbs, ratio, shape in searched[:5]:
            print(f"  {shape!r:34} {mbs:6.2f} MB/s, {ratio:6.1f}x a plain regex pass")

    caught = [text for text, secret in SECRETS if secret not in redact.redact_text(text)]
    print(
        f"secret shapes caught: {len(caught)} of {len(SECRETS)} ({len(caught) / len(SECRETS):.0%}, goal: all)"
    )
    for text, secret in SECRETS:
        if secret in redact.redact_text(text):
            print(f"  missed: {text[:60]!r}")
    altered = [text for text in clean if redact.redact_text(text) != text]
    print(
        f"clean records altered: {len(altered)} of {len(clean)} ({len(altered) / len(clean):.2%}, goal <= 0.5%)"
    )
    for text in altered[:10]:
        print(f"  altered: {text[:80]!r}")
    labelled_by_shape()


def labelled_by_shape() -> None:
    """tests/data/secrets_labelled.jsonl by shape (issue 50: `argument`, a password a command takes as a plain
    argument; `prose`, one named in a sentence; `other`, the rest): secrets caught, everyday lines altered."""
    import json

    rows = [
        json.loads(line)
        for line in (Path(__file__).parents[1] / "data" / "secrets_labelled.jsonl").open()
    ]
    for shape in sorted({r.get("shape", "other") for r in rows}):
        mine = [r for r in rows if r.get("shape", "other") == shape]
        secret = [r for r in mine if r["kinds"]]
        caught = [
            r for r in secret if not any(s in redact.redact_text(r["text"]) for s in r["secrets"])
        ]
        clean = [r for r in mine if not r["kinds"]]
        altered = [r for r in clean if redact.redact_text(r["text"]) != r["text"]]
        print(
            f"labelled {shape}: secrets caught {len(caught)} of {len(secret)} "
            f"({len(caught) / max(len(secret), 1):.0%}); everyday lines altered {len(altered)} of {len(clean)} "
            f"({len(altered) / max(len(clean), 1):.1%})"
        )


if __name__ == "__main__":
    main()
