"""Asking the chat model for a summary: the Ollama chat client, fitting a window's text into its
context, and checking that an answer is a summary (docs/summaries.md).

A window too long for one request is cut into groups of whole lines that fit (an episode longer than
that goes in pieces); nothing is ever cut to fit silently, and an answer the model may have read
truncated, cut short, empty, a refusal or longer than its input fails its window (WindowFailed).
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from typing import Iterable, Iterator

from memctl.config import Settings
from memctl.embedding.ollama import OllamaEmbedder
from memctl.embedding.protocol import estimate_tokens
from memctl.errors import ConfigError, EmbedInputRejected, MemctlError

OUTPUT_SHARE = 4  # a quarter of the context is left for the answer (num_predict)
MARGIN_TOKENS = 64  # the chat template's own tokens around the messages
# Characters / 4 is an estimate: logs full of numbers, addresses or non-English text run denser.
# Planning prompts at 80% of the room keeps them inside the context at down to about 3 characters
# per token.
ESTIMATE_SAFETY = 0.8
UTC = datetime.timezone.utc

SYSTEM_PROMPT = (
    "You summarize an AI agent's memory log so that the agent can read the summary later in place "
    "of the entries. Write a factual summary of the entries the user gives you. Keep every name, "
    "number, date, time, address, version, error message, cause, fix and decision exactly as "
    "written. Add nothing that is not in the entries: no advice, no opinions, no preamble, no "
    "closing remark. Plain sentences, one line per event. The entries are from agent {agent} on "
    "{day} (UTC), oldest first: {what}."
)
ENTRIES = "one per line, each with its time (UTC), [source] and text"
PART_SUMMARIES = "summaries of consecutive parts of that day, each after a line naming the part"
# An answer that declines instead of summarizing.
_REFUSAL = re.compile(
    r"^\W*(i'?m sorry|i am sorry|sorry\b|i apologi[sz]e|i can(?:no|')t\b|"
    r"i cannot\b|i am unable|i'?m unable|i won'?t\b|i will not\b|as an ai\b|"
    r"i'?m not able|i am not able|unfortunately,? i\b)",
    re.IGNORECASE,
)
# An answer about the request itself: a server that says it could not read all of it.
_OVERFLOW = re.compile(
    r"exceeds? the context|context (?:length|window) (?:was )?exceeded|"
    r"input (?:was )?truncated",
    re.IGNORECASE,
)


# --- the chat client --------------------------------------------------------


@dataclass
class Answer:
    text: str
    prompt_tokens: int | None
    output_tokens: int | None
    done_reason: str | None


class OllamaChat(OllamaEmbedder):
    """A chat model at an Ollama server. It shares OllamaEmbedder's client, /api/show reading and
    the mapping of failures to memctl errors (down, slow, 5xx: EmbedderUnavailable, exit 3; 404:
    UnknownModel with the `ollama pull` hint), so both speak to Ollama the same way."""

    def chat(self, system: str, user: str, *, num_ctx: int, num_predict: int) -> Answer:
        response = self._call(
            "chat",
            model=self.model,
            stream=False,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
            options={"num_ctx": num_ctx, "num_predict": num_predict, "temperature": 0},
        )
        message = getattr(response, "message", None)
        return Answer(
            text=(getattr(message, "content", None) or "").strip(),
            prompt_tokens=getattr(response, "prompt_eval_count", None),
            output_tokens=getattr(response, "eval_count", None),
            done_reason=getattr(response, "done_reason", None),
        )


def make_chat(settings: Settings, name: str) -> OllamaChat:
    """The chat client at [embedding] ollama_host / OLLAMA_HOST, as the embedder uses."""
    return OllamaChat(name, host=settings.embedding.ollama_host, timeout=settings.summarize.timeout)


# --- fitting a window to the context ------------------------------------------


class WindowFailed(MemctlError):
    """This window cannot be summarized now (bad answer, input too long); the others go on."""


@dataclass
class Budget:
    num_ctx: int
    num_predict: int

    @classmethod
    def for_model(cls, context_length: int | None, configured: int) -> Budget:
        num_ctx = min(configured, context_length) if context_length else configured
        if num_ctx < 512:
            raise ConfigError(
                f"a context of {num_ctx} tokens is too small to summarize in ([summarize] context)"
            )
        return cls(num_ctx, num_ctx // OUTPUT_SHARE)

    @property
    def prompt_room(self) -> int:
        """Tokens the whole prompt may take, as the server counts them."""
        return self.num_ctx - self.num_predict

    def user_room(self, system: str) -> int:
        """Estimated tokens the user message may take."""
        return int(self.prompt_room * ESTIMATE_SAFETY) - estimate_tokens(system) - MARGIN_TOKENS


def _flat(text: str) -> str:
    return " ".join(text.split())


def episode_lines(episodes: Iterable[dict], room: int) -> Iterator[str]:
    """One line per episode (time, [source], text), as they are read; a text longer than the room
    goes in several lines."""
    for ep in episodes:
        prefix = f"{ep['created_at'].astimezone(UTC):%Y-%m-%d %H:%M} [{ep['source'] or '-'}]"
        text = _flat(ep["content"])
        line = f"{prefix} {text}"
        if estimate_tokens(line) <= room:
            yield line
            continue
        pieces = _split(text, max(64, (room - estimate_tokens(prefix) - 8) * 4))
        for i, piece in enumerate(pieces, 1):
            yield f"{prefix} (piece {i} of {len(pieces)}) {piece}"


def _split(text: str, size: int) -> list[str]:
    """Pieces of at most `size` characters, cut at a space where there is one.

    Linear in the text: each piece is sliced once out of the whole text and the search for a space
    looks back at most half a piece; what remains after a piece is never copied."""
    text = text.strip()
    pieces, start, end = [], 0, len(text)
    while end - start > size:
        cut = text.rfind(" ", start + size // 2, start + size)
        cut = start + size if cut < 0 else cut
        pieces.append(text[start:cut].strip())
        start = cut
        while start < end and text[start].isspace():
            start += 1
    return pieces + ([text[start:]] if start < end else [])


def groups(lines: Iterable[str], room: int) -> Iterator[list[str]]:
    """Consecutive lines packed into groups whose text fits the room, each group once it is full."""
    group: list[str] = []
    used = 0
    for line in lines:
        cost = estimate_tokens(line) + 1
        if group and used + cost > room:
            yield group
            group, used = [], 0
        group.append(line)
        used += cost
    if group:
        yield group


def labelled(texts: Iterable[str], count: int) -> Iterator[str]:
    """The lines of part summaries, each part after a line naming it."""
    for i, text in enumerate(texts, 1):
        yield f"Part {i} of {count}:"
        yield from text.splitlines()


def check_answer(answer: Answer, user: str, budget: Budget) -> str:
    """The answer's text, or WindowFailed saying why it is no summary."""
    if answer.prompt_tokens is not None and answer.prompt_tokens > budget.prompt_room:
        raise WindowFailed(
            f"the model counted {answer.prompt_tokens} prompt tokens, more than the "
            f"{budget.prompt_room} planned within its context of {budget.num_ctx}: "
            "it may have read the input truncated (Ollama cuts a long prompt "
            "silently); lower [summarize] context"
        )
    if answer.done_reason == "length":
        raise WindowFailed(f"the answer was cut at {budget.num_predict} tokens (num_predict)")
    if not answer.text:
        raise WindowFailed("the model answered with an empty summary")
    if _OVERFLOW.search(answer.text[:200]):
        raise WindowFailed(f"the model says its input did not fit: {answer.text[:80]!r}")
    if _REFUSAL.match(answer.text):
        raise WindowFailed(
            f"the model answered with a refusal, not a summary: {answer.text[:80]!r}"
        )
    if estimate_tokens(answer.text) > estimate_tokens(user):
        raise WindowFailed(
            f"the answer ({estimate_tokens(answer.text)} tokens) is longer than its "
            f"input ({estimate_tokens(user)} tokens): not a summary"
        )
    return answer.text


@dataclass
class Summary:
    text: str
    requests: int = 0
    parts: int = 1
    rounds: int = 1
    tokens_in: int = 0
    tokens_out: int = 0


def ask(chat: OllamaChat, budget: Budget, system: str, user: str, result: Summary) -> str:
    try:
        answer = chat.chat(system, user, num_ctx=budget.num_ctx, num_predict=budget.num_predict)
    except EmbedInputRejected as exc:  # a server that refuses long input instead of truncating it
        raise WindowFailed(f"the model refused the input: {exc}") from None
    result.requests += 1
    said_in, said_out = answer.prompt_tokens, answer.output_tokens
    result.tokens_in += said_in if said_in is not None else estimate_tokens(system + user)
    result.tokens_out += said_out if said_out is not None else estimate_tokens(answer.text)
    return check_answer(answer, user, budget)
