"""Split text into overlapping chunks by characters (code points, never bytes).

A chunk ends at the last whitespace in its final fifth when there is one, so
words are rarely cut; a text without whitespace is cut hard at max_chars.
"""

from __future__ import annotations

from memctl import model_catalogue

# Chunks are sized so that even at about three characters a token they fit the model's context.
CHARS_PER_TOKEN_FLOOR = 3


def chunk_size_for(model: str, max_chars: int) -> int:
    """The configured chunk size, capped so the model's context holds a chunk."""
    context = model_catalogue.context_tokens(model)
    if context is None:
        return max_chars
    return max(64, min(max_chars, context * CHARS_PER_TOKEN_FLOOR))


def chunk_text(text: str, max_chars: int, overlap: int) -> list[str]:
    if max_chars <= 0:
        raise ValueError("max_chars must be positive")
    overlap = max(0, min(overlap, max_chars // 2))
    if len(text) <= max_chars:
        return [text]
    chunks = []
    start = 0
    length = len(text)
    while start < length:
        end = min(start + max_chars, length)
        if end < length:
            floor = end - max_chars // 5
            cut = max(text.rfind(" ", floor, end), text.rfind("\n", floor, end))
            if cut > start:
                end = cut + 1
        chunks.append(text[start:end])
        if end >= length:
            break
        start = max(end - overlap, start + 1)
    return chunks
