"""The texts tests/test_minilm.py holds memctl's all-MiniLM-L6-v2 to, and tests/data/minilm_reference.py asks the
reference (sentence-transformers) about: one list, so the stored answers are for the texts the tests send."""

from __future__ import annotations

import json
import random
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "retrieval.json"
MAX_TOKENS = 256
REFERENCE_TENSORS = (
    "embeddings.word_embeddings.weight",
    "encoder.layer.5.output.dense.weight",
    "pooler.dense.bias",
)
NON_ASCII = [
    "Über die Brücke: Größe, Maß und Öl",
    "café naïve résumé coöperate façade",
    "東京の天気は晴れです。明日は雨が降るでしょう。",
    "数据库主服务器在凌晨三点重启",
    "서버가 다운되었습니다",
    "Привет, как дела? Сервер перезагружен.",
    "مرحبا بالعالم، الخادم يعمل",
    "שלום עולם",
    "नमस्ते दुनिया, डिस्क भर गई है",
    "deploy ✅ failed ❌ disk 💾 full 🔥🔥",
    "Ελληνικά γράμματα: αβγδε",
    "tab\tseparated\tvalues and a\u00a0non-breaking space",
    "zero\u200bwidth joiner and combining e\u0301 accents",
    "control \x07 bell and \x1b escape characters",
    "ﬁ ligature, ½ fraction, Ⅻ numeral, ｆｕｌｌｗｉｄｔｈ",
]
EDGES = [
    "a",
    "",
    " ",
    "\n\n",
    "?",
    "...",
    "[CLS]",
    "[SEP] [PAD] [MASK] [UNK]",
    "I",
    "ok",
    "x" * 500,
    "supercalifragilisticexpialidocious",
    "  leading and trailing whitespace  ",
]
WORDS = (
    "deploy disk full nginx logs rotated postgres replica lag redis eviction memory pressure queue backlog "
    "consumer scaled certificate renewal backup restore latency index customer refund release the a of to and "
    "in is was it for on with after because when we they kubernetes pod OOMKilled 10.8.0.4:5432 /var/log "
    "v2.3.1 2026-08-11 03:10 UTC 4GB p95 200ms HTTP/1.1 503 user@example.com"
).split()


def varied_texts() -> list[str]:
    """About three hundred texts: short, medium, over 256 tokens (truncated), non-ASCII, nearly empty."""
    rng = random.Random(11)
    data = json.loads(DATA.read_text())
    texts = list(data["episodes"]) + [q["q"] for q in data["questions"]]
    texts += NON_ASCII + EDGES
    texts += [" ".join(rng.choices(WORDS, k=rng.randint(1, 40))) for _ in range(160)]
    texts += [
        " ".join(rng.choices(WORDS, k=rng.randint(230, 600))) for _ in range(30)
    ]  # > 256 tokens
    texts += [" ".join(rng.choices(NON_ASCII, k=12)) for _ in range(6)]  # long and non-ASCII
    texts += [
        "def f(x):\n    return {'a': [1, 2, 3]}[x]  # code",
        "SELECT id FROM t WHERE a = $1;",
        "https://x.io/a?b=c",
    ]
    return texts
