"""all-MiniLM-L6-v2 written out in numpy: the local embedder without torch.

The network is small and fixed (BERT, 6 layers, 384 wide, 12 heads, mean
pooling, L2 normalisation), so its forward pass fits in this module and gives
the vectors sentence-transformers gives (cosine >= 0.9999), while a fresh
process imports only numpy and `tokenizers` (about 0.3 s) instead of
sentence-transformers and torch (about 8 s).

The weights are read from the bundled model.safetensors through a memory map:
the format is an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range, then the raw little-endian data. Only the
embedding rows a text uses are paged in.

This module never downloads anything and never imports torch. Importing it
imports numpy and tokenizers: an ImportError here means the `local` extra is
not installed.
"""

from __future__ import annotations

import json
import math
import struct
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from memctl.errors import MemctlError

CONFIG = {
    "num_attention_heads": 12,
    "hidden_size": 384,
    "layer_norm_eps": 1e-12,
    "num_hidden_layers": 6,
}
MAX_TOKENS = 256  # sentence_bert_config.json max_seq_length: longer input is truncated
# Tokens per forward pass. Attention scores take batch * 12 * length^2 floats,
# so a pass of 256-token texts holds 8 of them (25 MB); short texts go in larger groups.
TOKENS_PER_PASS = 2048
GELU_ROWS = 256  # rows of the 1536-wide activation per GELU step: stays in cache
# One BLAS thread per pass. OpenBLAS threads spin-wait at every small matrix product;
# on a 2-core machine with anything else running, 2 threads made a one-query search
# about ten times slower (docs/benchmarks.md). Throughput comes from running groups
# of texts side by side instead (`workers`), which degrades gracefully under load.
BLAS_THREADS = 1

_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I64": "<i8", "I32": "<i4"}
_MAX_HEADER = 100 << 20


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as a read-only array over a memory map of it."""
    try:
        with open(path, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            if size > _MAX_HEADER:
                raise MemctlError(f"{path} is not a safetensors file (header of {size} bytes)")
            header = json.loads(handle.read(size))
        data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + size)
    except OSError as exc:
        raise MemctlError(f"cannot read the local model weights {path}: {exc.strerror}") from None
    except (struct.error, ValueError) as exc:
        raise MemctlError(f"{path} is not a safetensors file: {exc}") from None
    tensors = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(meta["dtype"])
        start, end = meta["data_offsets"]
        if dtype is None or end > data.size:
            raise MemctlError(
                f"{path}: tensor {name} has dtype {meta['dtype']} or range {start}:{end} this reader does not take"
            )
        tensors[name] = data[start:end].view(dtype).reshape(meta["shape"])
    return tensors


@dataclass
class Layer:
    """One encoder layer's weights, matrices transposed to (in, out) for x @ w."""

    qkv_w: np.ndarray
    qkv_b: np.ndarray
    out_w: np.ndarray
    out_b: np.ndarray
    norm1_w: np.ndarray
    norm1_b: np.ndarray
    up_w: np.ndarray
    up_b: np.ndarray
    down_w: np.ndarray
    down_b: np.ndarray
    norm2_w: np.ndarray
    norm2_b: np.ndarray


def _layer(t: dict[str, np.ndarray], i: int, head_size: int) -> Layer:
    p = f"encoder.layer.{i}."
    a = p + "attention."
    # q, k and v in one matmul; q carries the 1/sqrt(head size) of the attention scores.
    scale = np.float32(1.0 / math.sqrt(head_size))
    qkv_w = np.concatenate(
        [t[a + "self.query.weight"] * scale, t[a + "self.key.weight"], t[a + "self.value.weight"]]
    )
    return Layer(
        qkv_w=np.ascontiguousarray(qkv_w.T),
        qkv_b=np.concatenate(
            [t[a + "self.query.bias"] * scale, t[a + "self.key.bias"], t[a + "self.value.bias"]]
        ),
        out_w=t[a + "output.dense.weight"].T,
        out_b=t[a + "output.dense.bias"],
        norm1_w=t[a + "output.LayerNorm.weight"],
        norm1_b=t[a + "output.LayerNorm.bias"],
        up_w=t[p + "intermediate.dense.weight"].T,
        up_b=t[p + "intermediate.dense.bias"],
        down_w=t[p + "output.dense.weight"].T,
        down_b=t[p + "output.dense.bias"],
        norm2_w=t[p + "output.LayerNorm.weight"],
        norm2_b=t[p + "output.LayerNorm.bias"],
    )


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the last axis, in place on x (which the caller owns)."""
    x -= x.mean(axis=-1, keepdims=True)
    scale = np.square(x).mean(axis=-1, keepdims=True)
    scale += eps
    np.sqrt(scale, out=scale)
    x /= scale
    x *= weight
    x += bias
    return x


# Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7, under float32 resolution): the same
# polynomial torch's vectorised CPU erf uses, so GELU here is the exact erf GELU.
_ERF_P = 0.3275911
_ERF_A = (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)


def _gelu(x: np.ndarray) -> np.ndarray:
    """x * Phi(x) in place, written as 0.5x + 0.5|x| erf(|x|/sqrt 2) so no branch on the sign."""
    a = np.abs(x)
    t = a * np.float32(_ERF_P / math.sqrt(2.0))
    t += 1.0
    np.reciprocal(t, out=t)
    poly = t * np.float32(_ERF_A[0])
    for coefficient in _ERF_A[1:]:
        poly += np.float32(coefficient)
        poly *= t
    np.square(a, out=t)
    t *= -0.5
    np.exp(t, out=t)
    poly *= t  # erfc(|x|/sqrt 2)
    poly *= -0.5
    poly += 0.5  # 0.5 erf(|x|/sqrt 2)
    poly *= a
    x *= 0.5
    x += poly
    return x


class Encoder:
    """all-MiniLM-L6-v2: texts in, unit 384-dim float32 vectors out."""

    def __init__(self, tokenizer, tensors: dict[str, np.ndarray], config: dict) -> None:
        self.tokenizer = tokenizer
        self.heads = int(config["num_attention_heads"])
        self.hidden = int(config["hidden_size"])
        self.eps = float(config["layer_norm_eps"])
        self.word = tensors["embeddings.word_embeddings.weight"]
        self.position = tensors["embeddings.position_embeddings.weight"]
        self.token_type = tensors["embeddings.token_type_embeddings.weight"]
        self.norm_w = tensors["embeddings.LayerNorm.weight"]
        self.norm_b = tensors["embeddings.LayerNorm.bias"]
        self.layers = [
            _layer(tensors, i, self.hidden // self.heads)
            for i in range(int(config["num_hidden_layers"]))
        ]
        self.sep_id = tokenizer.token_to_id("[SEP]")
        self.workers = max(1, min(2, os.cpu_count() or 1))

    @classmethod
    def from_dir(cls, model_dir: Path) -> "Encoder":
        model_dir = Path(model_dir)
        try:
            tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
            config_file = model_dir / "config.json"
            # all-MiniLM-L6-v2's own shape when a directory holds only the weights and the tokenizer
            # (the weights' sha256 was checked before: they are this network).
            config = json.loads(config_file.read_text()) if config_file.exists() else CONFIG
        except Exception as exc:  # OSError, a bad JSON file, or the tokenizers package's own error
            raise MemctlError(f"cannot read the local model in {model_dir}: {exc}") from None
        # tokenizer.json carries fixed 128-token padding and truncation; the model's
        # context is 256 (sentence_bert_config.json), applied in token_ids().
        tokenizer.no_padding()
        tokenizer.no_truncation()
        return cls(tokenizer, read_safetensors(model_dir / "model.safetensors"), config)

    def count_tokens(self, text: str) -> int:
        """WordPiece tokens of the whole text, [CLS] and [SEP] included, before truncation."""
        return len(self.tokenizer.encode(text).ids)

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        """Ids as the model sees them: cut to MAX_TOKENS, ending in [SEP] as Hugging Face truncation does."""
        ids = [e.ids for e in self.tokenizer.encode_batch(list(texts))]
        return [i if len(i) <= MAX_TOKENS else i[: MAX_TOKENS - 1] + [self.sep_id] for i in ids]

    def encode(self, texts: list[str]) -> list[list[float]]:
        return self.encode_array(texts).tolist()

    def encode_array(self, texts: list[str]) -> np.ndarray:
        """(len(texts), 384) float32 unit vectors, in input order.

        Texts go through the network in groups of similar length (sorted), so
        little compute is spent on padding; the order is restored at the end.
        With more than one group, `workers` threads (at most 2) run groups side
        by side, each with one BLAS thread: numpy releases the GIL in both.
        """
        ids = self.token_ids(texts)
        out = np.empty((len(ids), self.hidden), dtype=np.float32)
        groups = _groups(ids)
        with _blas_threads(BLAS_THREADS):
            if len(groups) <= 1 or self.workers == 1:
                for group in groups:
                    out[group] = self._forward([ids[i] for i in group])
            else:
                with ThreadPoolExecutor(min(self.workers, len(groups))) as pool:
                    done = pool.map(lambda g: self._forward([ids[i] for i in g]), groups)
                    for group, vectors in zip(groups, done):
                        out[group] = vectors
        return out

    def _forward(self, batch: list[list[int]]) -> np.ndarray:
        """Pooled, normalised vectors of one group, padded to its longest text."""
        n, h, length = len(batch), self.hidden, max(len(tokens) for tokens in batch)
        ids = np.zeros((n, length), dtype=np.int64)
        mask = np.zeros((n, length), dtype=np.float32)
        for row, tokens in enumerate(batch):
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1.0
        x = self.word[ids] + self.position[:length] + self.token_type[0]
        x = _layer_norm(x.reshape(n * length, h), self.norm_w, self.norm_b, self.eps)
        # Padding gets the most negative float added to its scores, as transformers does;
        # a group of equal lengths (common once sorted) has none.
        padded = bool(mask.min() == 0.0)
        bias = ((1.0 - mask) * np.finfo(np.float32).min)[:, None, None, :] if padded else None
        for layer in self.layers:
            x = self._layer(x, layer, bias, n, length)
        x = x.reshape(n, length, h)
        pooled = np.einsum("blh,bl->bh", x, mask) / np.maximum(
            mask.sum(axis=1, keepdims=True), 1e-9
        )
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return pooled / np.maximum(norms, 1e-12)

    def _layer(
        self, x: np.ndarray, w: Layer, bias: np.ndarray | None, n: int, length: int
    ) -> np.ndarray:
        h, heads = self.hidden, self.heads
        size = h // heads
        qkv = x @ w.qkv_w
        qkv += w.qkv_b
        q, k, v = qkv.reshape(n, length, 3, heads, size).transpose(2, 0, 3, 1, 4)
        scores = q @ k.transpose(0, 1, 3, 2)  # (n, heads, length, length), already scaled through q
        if bias is not None:
            scores += bias
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        context = (scores @ v).transpose(0, 2, 1, 3).reshape(n * length, h)
        del scores
        attended = context @ w.out_w
        attended += w.out_b
        attended += x
        x = _layer_norm(attended, w.norm1_w, w.norm1_b, self.eps)
        out = np.empty_like(x)
        for row in range(0, x.shape[0], GELU_ROWS):
            up = x[row : row + GELU_ROWS] @ w.up_w
            up += w.up_b
            np.matmul(_gelu(up), w.down_w, out=out[row : row + GELU_ROWS])
        out += w.down_b
        out += x
        return _layer_norm(out, w.norm2_w, w.norm2_b, self.eps)


def _groups(ids: list[list[int]]) -> list[list[int]]:
    """Indexes of the texts, longest first, in groups of about TOKENS_PER_PASS padded tokens."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]), reverse=True)
    groups, start = [], 0
    while start < len(order):
        size = max(1, TOKENS_PER_PASS // len(ids[order[start]]))
        groups.append(order[start : start + size])
        start += size
    return groups


@contextmanager
def _blas_threads(count: int):
    """Limit numpy's BLAS to `count` threads for a block, when threadpoolctl is at hand."""
    controller = _controller()
    with (
        controller.limit(limits=count, user_api="blas") if controller is not None else nullcontext()
    ):
        yield


_controller_cache: list = []


def _controller():
    if not _controller_cache:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # results are the same, only slower on a busy machine
            _controller_cache.append(None)
        else:
            _controller_cache.append(ThreadpoolController())
    return _controller_cache[0]


_encoders: dict[Path, Encoder] = {}
_lock = threading.Lock()


def load(model_dir: Path | str) -> Encoder:
    """The encoder for model_dir, loaded once per process."""
    key = Path(model_dir).resolve()
    # tokenizers warns on stderr in a process forked after it used its thread pool; a
    # library must not talk, and tokenizing is a rounding error beside the network.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with _lock:
        if key not in _encoders:
            _encoders[key] = Encoder.from_dir(key)
        return _encoders[key]
