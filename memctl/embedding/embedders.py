"""The one way to get an embedder (make_embedder), and the deterministic one (HashEmbedder).

make_embedder gives a registered model's embedder (the database knows which model and instructions
its vectors came from) or the configured one: Ollama (memctl.embedding.ollama), the local network
(memctl.embedding.local) or the hash embedder, offline, for tests and smoke runs
(docs/embedding-models.md).
"""

from __future__ import annotations

import hashlib
import re
import time
from typing import TYPE_CHECKING, Any

from memctl import model_catalogue
from memctl.embedding.local import LOCAL_DIMS, LOCAL_MODEL, LocalEmbedder
from memctl.embedding.ollama import OllamaEmbedder
from memctl.embedding.protocol import Embedder, EmbedResult, estimate_tokens, l2_normalise
from memctl.errors import UsageError

if TYPE_CHECKING:
    from memctl.config import Embedding as EmbeddingSettings, Settings

EMBEDDERS = ("ollama", "local", "hash")


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
        """Bucket and sign from one keyed hash, keyed by the model name: two hash models differ."""
        value = int.from_bytes(
            hashlib.blake2b(feature.encode(), digest_size=8, key=self._key).digest(), "big"
        )
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
        return EmbedResult(
            vectors=vectors, prompt_eval_count=tokens, elapsed_s=time.perf_counter() - started
        )


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
    made = _make(
        settings,
        embedder or _configured(settings).embedder,
        model,
        explicit_model,
        dimensions,
        timeout,
    )
    made.query_prefix, made.document_prefix = (
        (registered.query_prefix, registered.document_prefix)
        if registered is not None
        else configured_instructions(settings, made)
    )
    return made


def configured_instructions(settings: Settings | None, embedder: Any) -> tuple[str, str]:
    """The instructions a model registered now gets: the model card's, or the configuration's
    `query_prefix` / `document_prefix` where the configuration names this model."""
    query, document = model_catalogue.instructions(embedder.model)
    conf = _configured(settings)
    if embedder.model == conf.model and embedder.name == conf.embedder:
        query, document = (
            default if value is None else value
            for value, default in ((conf.query_prefix, query), (conf.document_prefix, document))
        )
    return query, document


def _make(
    settings: Settings | None,
    name: str,
    model: str | None,
    explicit_model: str | None,
    dimensions: int | None,
    timeout: float | None,
) -> Any:
    if name == "ollama":
        conf = _configured(settings)
        return OllamaEmbedder(
            model,
            host=conf.ollama_host,
            dimensions=dimensions,
            timeout=timeout if timeout is not None else conf.timeout,
        )
    if name == "local":
        if explicit_model is not None and explicit_model.removesuffix(":latest") != LOCAL_MODEL:
            raise UsageError(f"the local embedder has one model, {LOCAL_MODEL}; got {model!r}")
        if dimensions is not None and dimensions != LOCAL_DIMS:
            raise UsageError(
                f"the local embedder makes {LOCAL_DIMS}-dim vectors; got dimensions={dimensions}"
            )
        return LocalEmbedder(_configured(settings).local_path)
    if name == "hash":
        model = model or "hash-embed"
        return HashEmbedder(
            model, dims=dimensions or model_catalogue.known_dims(model) or LOCAL_DIMS
        )
    raise UsageError(f"unknown embedder {name!r}: choose one of {', '.join(EMBEDDERS)}")
