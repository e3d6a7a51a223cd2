"""The production embedder: an Ollama server's /api/embed through the official client.

The client (``ollama``, ``httpx``) is imported on first use, never at module import, so commands
that never embed start fast; its failures are raised as ``memctl.errors`` classes
(docs/embedding-models.md).
"""

from __future__ import annotations

import os
import re
import time
import urllib.parse
from typing import Any

from memctl.embedding.protocol import EmbedResult, check_shape, estimate_tokens, l2_normalise
from memctl.errors import (
    EmbedderUnavailable,
    EmbedInputRejected,
    MemctlError,
    UnknownModel,
    UsageError,
)

DEFAULT_OLLAMA_HOST = "http://127.0.0.1:11434"


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


class OllamaEmbedder:
    """Embeds through an Ollama server's /api/embed, mapping its failures to memctl errors."""

    name = "ollama"
    query_prefix = document_prefix = ""

    def __init__(
        self,
        model: str | None,
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
        """The client, made on first use: importing ollama costs a noticeable part of start-up."""
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
            return UnknownModel(
                f"model '{self.model}' not found on ollama at {host}: "
                f"run `ollama pull {self.model}`"
            )
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
        """Requested size if set, else the model's native size; else a probe embed's."""
        if self._dims is None:
            native = self._info_value("embedding_length")
            if native is None:
                native = len(self.embed(["dimension probe"]).vectors[0])
            self._dims = native
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
        self._dims = check_shape(vectors, len(texts), self._dims, self.model)
        return EmbedResult(
            vectors=vectors, prompt_eval_count=response.prompt_eval_count, elapsed_s=elapsed
        )
