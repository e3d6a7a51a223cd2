"""What memctl knows of common embedding models before asking any server: dimensions, context windows
and the task instructions each model card asks for.

Pure data in the base layer, so that the chunker (memctl.write.chunking: chunks sized to the model's
context), the embedders (memctl.embedding.embedders and .local: the hash and local models' dimensions) and the size
estimates (memctl.embedding.footprint) share one table without importing each other.
"""

from __future__ import annotations

# Native dimensions, by Ollama's name (`:latest` is the same model).
KNOWN_DIMS = {
    "all-minilm": 384,
    "bge-small": 384,
    "bge-small-en-v1.5": 384,
    "snowflake-arctic-embed:s": 384,
    "nomic-embed-text": 768,
    "embeddinggemma": 768,
    "snowflake-arctic-embed:m": 768,
    "mxbai-embed-large": 1024,
    "bge-m3": 1024,
    "snowflake-arctic-embed": 1024,
    "snowflake-arctic-embed:l": 1024,
    "qwen3-embedding:0.6b": 1024,
    "qwen3-embedding:4b": 2560,
    "qwen3-embedding:8b": 4096,
    "multilingual-e5-small": 384,
    "multilingual-e5-base": 768,
    "multilingual-e5-large": 1024,
    "e5-small-v2": 384,
    "e5-base-v2": 768,
    "e5-large-v2": 1024,
    "bge-large": 1024,
    "snowflake-arctic-embed2": 1024,
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
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
    "multilingual-e5-small": 512,
    "multilingual-e5-base": 512,
    "multilingual-e5-large": 512,
    "e5-small-v2": 512,
    "e5-base-v2": 512,
    "e5-large-v2": 512,
    "bge-large": 512,
    "bge-small": 512,
    "bge-small-en-v1.5": 512,
    "snowflake-arctic-embed2": 8192,
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


# Each model's task instructions: (query prefix, document prefix), by the model's name before any `:tag`.
# A model trained with them expects them on every input; Ollama does not add them, so memctl does
# (memctl.embedding.protocol.as_queries / as_documents), never into the stored text. Models not named
# here take text as it is (all-minilm, bge-m3: their cards ask for no instruction).
_BGE_QUERY = "Represent this sentence for searching relevant passages: "
_E5 = ("query: ", "passage: ")
INSTRUCTIONS = {
    # https://huggingface.co/nomic-ai/nomic-embed-text-v1.5 ("Task instruction prefixes": the text
    # prompt *must* include a task instruction prefix), https://ollama.com/library/nomic-embed-text
    "nomic-embed-text": ("search_query: ", "search_document: "),
    # https://huggingface.co/intfloat/multilingual-e5-small ("Each input text should start with
    # 'query: ' or 'passage: '"); the same on the e5-*-v2 and multilingual-e5-base/large cards.
    "multilingual-e5-small": _E5,
    "multilingual-e5-base": _E5,
    "multilingual-e5-large": _E5,
    "e5-small-v2": _E5,
    "e5-base-v2": _E5,
    "e5-large-v2": _E5,
    # https://huggingface.co/BAAI/bge-small-en-v1.5 and bge-large-en-v1.5 ("add instruction to query,
    # no instruction for passages"); Ollama's bge-large is bge-large-en-v1.5.
    "bge-small": (_BGE_QUERY, ""),
    "bge-small-en-v1.5": (_BGE_QUERY, ""),
    "bge-large": (_BGE_QUERY, ""),
    # https://huggingface.co/mixedbread-ai/mxbai-embed-large-v1 ("Represent this sentence for searching
    # relevant passages: " before a query; documents as they are), https://ollama.com/library/mxbai-embed-large
    "mxbai-embed-large": (_BGE_QUERY, ""),
    # https://huggingface.co/Snowflake/snowflake-arctic-embed-m (the same query prefix, none for
    # documents), https://ollama.com/library/snowflake-arctic-embed
    "snowflake-arctic-embed": (_BGE_QUERY, ""),
    # https://huggingface.co/Snowflake/snowflake-arctic-embed-l-v2.0 ("query: " before a query only),
    # https://ollama.com/library/snowflake-arctic-embed2
    "snowflake-arctic-embed2": ("query: ", ""),
    # https://huggingface.co/google/embeddinggemma-300m ("Prompt instructions": retrieval query
    # "task: search result | query: ", document "title: none | text: "), https://ollama.com/library/embeddinggemma
    "embeddinggemma": ("task: search result | query: ", "title: none | text: "),
    # https://huggingface.co/Qwen/Qwen3-Embedding-0.6B (queries as f"Instruct: {task}\nQuery:{query}",
    # documents without instruction; the card's example task), https://ollama.com/library/qwen3-embedding
    "qwen3-embedding": (
        "Instruct: Given a web search query, retrieve relevant passages that answer the query\n"
        "Query:",
        "",
    ),
}


def instructions(model: str) -> tuple[str, str]:
    """(query prefix, document prefix) of a model, ("", "") for one that takes text as it is."""
    return INSTRUCTIONS.get(model.strip().lower().split(":", 1)[0], ("", ""))
