"""What every embedder is and gives: the protocol, its result, the helpers its kinds share.

An embedder turns texts into unit vectors, one per text, in order (memctl.embedding.ollama, .local,
and the hash embedder of memctl.embedding.embedders, which also makes them: make_embedder).
Imports nothing heavy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from memctl.errors import MemctlError


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


# make_embedder sets `query_prefix` / `document_prefix`, the model's task instructions. embed()
# sends
# texts as given; callers name a text's role with as_queries / as_documents (never the stored text).


def as_queries(embedder: Any, texts: list[str]) -> list[str]:
    """Texts as the model expects its queries: its query instruction first (most models: none)."""
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


def check_shape(vectors: list[list[float]], count: int, dims: int | None, model: str) -> int:
    """One vector per text, all of one size: a wrong answer must not reach the database."""
    if len(vectors) != count:
        raise MemctlError(
            f"dimension mismatch from model '{model}': asked for {count} vectors, "
            f"got {len(vectors)}"
        )
    expected = dims if dims is not None else (len(vectors[0]) if vectors else 0)
    for vector in vectors:
        if len(vector) != expected:
            raise MemctlError(
                f"dimension mismatch from model '{model}': expected {expected} dims, "
                f"got {len(vector)}"
            )
    return expected
