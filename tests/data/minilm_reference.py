"""Writes tests/data/minilm_reference.json: what sentence-transformers (the reference) makes of the texts
tests/test_minilm.py checks memctl.minilm against, so those tests need neither torch nor
sentence-transformers. Run once in an environment that has both (not part of the suite):

    python tests/data/minilm_reference.py
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    sys.path.insert(0, str(HERE.parent.parent))
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from memctl.embedding.local import bundled_model_dir
    from tests.minilm_texts import MAX_TOKENS, REFERENCE_TENSORS, varied_texts

    texts = varied_texts()
    model = SentenceTransformer(str(bundled_model_dir()), device="cpu")
    vectors = model.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
    counts = [
        len(model.tokenizer(t, add_special_tokens=True, verbose=False)["input_ids"]) for t in texts
    ]
    long = [t for t, c in zip(texts, counts) if c > MAX_TOKENS]
    truncated = model.tokenizer(long, truncation=True, max_length=MAX_TOKENS)["input_ids"]
    state = model[0].auto_model.state_dict()
    tensors = {
        name: hashlib.sha256(state[name].numpy().astype(np.float32).tobytes()).hexdigest()
        for name in REFERENCE_TENSORS
    }
    data = {
        "texts_sha256": hashlib.sha256(json.dumps(texts).encode()).hexdigest(),
        "dims": vectors.shape[1],
        "vectors_float16": base64.b64encode(vectors.astype("<f2").tobytes()).decode(),
        "token_counts": counts,
        "truncated": truncated,
        "tensors_sha256": tensors,
    }
    (HERE / "minilm_reference.json").write_text(json.dumps(data, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
