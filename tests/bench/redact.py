"""Redaction's rate on hostile and on everyday text, and both sides of what it catches (issue 37).

Printed: MB/s of `redact.find` on a realistic mix (the clean corpus of tests/redaction_shapes.py, with the
listed secret shapes sprinkled in, joined into records of a few KB) and on each adversarial shape of
--size characters, the worst of them named (goal: both >= 1 MB/s on one core); beside each, a plain
baseline measured in the same run (`str.lower` and one `re.finditer` over the same text) so a slow
machine reads as a ratio too. Then the share of listed secret shapes caught (goal: all) and the share of
clean records altered (goal <= 0.5%): the LoCoMo dev turns (../shared/eval, when present), the retrieval
test data and the labelled everyday lines.

    python tests/bench/redact.py [--size 200000] [--runs 3]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from memctl import redact  # noqa: E402
from tests.redaction_shapes import SECRETS, clean_corpus  # noqa: E402

ADVERSARIAL = ["token:", "password=", "pw: ", "db password: Hunter2x ", "api_key='", 'secret = "', "'", '"',
               "Bearer ", "Bearer abcdefghijklmnopqrstu1 ", "QUJDREVGR0hJSktM", "0123456789abcdef", "([{", ")]}",
               "eyJ", "eyJhbGciOi.", "ghp_", "AKIA", "glpat-", "sk-", "http://u:", "a://b:c@", "?token=",
               "-----BEGIN PRIVATE KEY-----\n", "mysql -pabc ", "curl -u a:", "--password ", "password is ",
               "aws secret access key ", "fact set db.pw ", "key ", "docker login -p x "]
_WORDS = re.compile(r"\w+")


def best(fn, text: str, runs: int) -> float:
    fastest = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        fn(text)
        fastest = min(fastest, time.perf_counter() - started)
    return fastest


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=200_000, help="characters per adversarial text and of the mix")
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    redact.find("warm up password='x' token: abc")
    clean = clean_corpus()

    mix = realistic(clean, a.size)
    started = time.perf_counter()
    for record in mix:
        redact.find(record)
    spent = time.perf_counter() - started
    mix_mb = sum(len(r.encode()) for r in mix) / 1e6
    print(f"realistic mix: {len(mix)} records, {mix_mb * 1e3:.0f} KB: {mix_mb / spent:.2f} MB/s (goal >= 1)")

    rates = []
    for shape in ADVERSARIAL:
        text = shape * (a.size // len(shape) + 1)
        mbs, ratio = rate(text, a.runs)
        rates.append((mbs, ratio, shape))
    for mbs, ratio, shape in sorted(rates)[:5]:
        print(f"  {shape!r:34} {mbs:6.2f} MB/s, {ratio:6.1f}x a plain regex pass")
    worst = min(rates)
    print(f"worst shape {worst[2]!r} x {a.size // len(worst[2]) + 1}: {worst[0]:.2f} MB/s (goal >= 1)")

    caught = [text for text, secret in SECRETS if secret not in redact.redact_text(text)]
    print(f"secret shapes caught: {len(caught)} of {len(SECRETS)} ({len(caught) / len(SECRETS):.0%}, goal: all)")
    for text, secret in SECRETS:
        if secret in redact.redact_text(text):
            print(f"  missed: {text[:60]!r}")
    altered = [text for text in clean if redact.redact_text(text) != text]
    print(f"clean records altered: {len(altered)} of {len(clean)} ({len(altered) / len(clean):.2%}, goal <= 0.5%)")
    for text in altered[:10]:
        print(f"  altered: {text[:80]!r}")


if __name__ == "__main__":
    main()
