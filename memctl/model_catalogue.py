"""What memctl knows of common embedding models before asking any server: dimensions and context windows.

Pure data in the base layer, so that the chunker (memctl.records.chunking: chunks sized to the model's
context), the embedders (memctl.embedding.embedders: the hash and local models' dimensions) and the size
estimates (memctl.embedding.footprint) share one table without importing each other.
"""

from __future__ import annotations

# Native dimensions, by Ollama's name (`:latest` is the same model).
KNOWN_DIMS = {
    "all-minilm": 384, "bge-small": 384, "bge-small-en-v1.5": 384, "snowflake-arctic-embed:s": 384,
    "nomic-embed-text": 768, "embeddinggemma": 768, "snowflake-arctic-embed:m": 768,
    "mxbai-embed-large": 1024, "bge-m3": 1024, "snowflake-arctic-embed": 1024, "snowflake-arctic-embed:l": 1024,
    "qwen3-embedding:0.6b": 1024, "qwen3-embedding:4b": 2560, "qwen3-embedding:8b": 4096,
    "text-embedding-3-small": 1536, "text-embedding-3-large": 3072,
}
# Context windows (tokens), by the model's name before any `:tag`.
KNOWN_CONTEXT_TOKENS = {
    "all-minilm": 256,
    "nomic-embed-text": 2048,
    "mxbai-embed-large": 512,
    "snowflake-arctic-embed": 512,
    "bge-m3": 8192,
    "embeddinggemma": 2048,
    "qwen3-embedding": 32768,
}
# The models `memctl size --estimate` shows when none is named: (model, dims, note).
COMMON_MODELS = [
    ("all-minilm", 384, None),
    ("bge-small", 384, None),
    ("nomic-embed-text", 768, None),
    ("mxbai-embed-large", 1024, None),
    ("text-embedding-3-small", 1536, "OpenAI's size; shown for comparison"),
    ("text-embedding-3-large", 3072, "OpenAI's size; shown for comparison"),
]


def known_dims(model: str) -> int | None:
    name = model.strip().lower()
    return KNOWN_DIMS.get(name) or KNOWN_DIMS.get(name.removesuffix(":latest"))


def context_tokens(model: str) -> int | None:
    return KNOWN_CONTEXT_TOKENS.get(model.split(":", 1)[0])
