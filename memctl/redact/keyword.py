"""detect-secrets' keyword plugin (`password = "..."`, `api_key: '...'`): the values its analyze_string reports
for a window, found in time linear in the window.

The plugin's five patterns are case-insensitive alternations of its DENYLIST words, and Python's re tries that
alternation at every position: 0.15 to 1.5 us a character for each pattern, 1-3 ms a 1 KB window of
`api_key='` or `pwd';` (0.3 MB/s for this plugin alone). The same first match of each pattern is found here by
trying it only where it can start:

- Four patterns start with a DENYLIST word then `\\w*`: they are tried only at the positions where a word
  starts (found with str.find in a case-folded copy), and in each run of word characters only at the first
  such position. A match at a later start p' of the same run implies one at the first start p: p's word ends
  no later than p''s (no word sits inside another one and ends before it: `_contained` is empty, a test holds
  it), so p's `\\w*` can reach wherever p''s reached, and the rest of the pattern matches from there alike.
  Trying p first therefore gives what `search` gives, the leftmost match; if p fails, so do the others.
- Each pattern needs a literal (`:`, `=`, `;`, two of `!=`), its quote after its separator (or before its `;`)
  and a word character after a quote: a window without them is not given to it.
- The fifth (a quoted value compared to a name: `"x" == password`) backtracks from each quote over the rest of the
  window (quadratic in it: 0.3 MB/s on a run of `` `db_pass=aws +/!= ``); `_compared` finds its value from the
  closing quotes a comparison follows, each matched once.

tests/test_redact_shapes.py compares `values` with the plugin's analyze_string on adversarial windows.
"""

from __future__ import annotations

import bisect
import re
from functools import lru_cache

# Case folding as re.IGNORECASE folds the characters of the DENYLIST words, one character for one (measured over
# every code point: the ASCII capitals, İ and ı for i, the Kelvin sign for k, long s for s, Ñ for ñ), so that
# positions in the folded copy are positions in the text.
FOLD = str.maketrans(
    {
        **{chr(c): chr(c + 32) for c in range(ord("A"), ord("Z") + 1)},
        "\u0130": "i",
        "\u0131": "i",
        "\u212a": "k",
        "\u017f": "s",
        "\u00d1": "\u00f1",
    }
)
_NOT_WORD = re.compile(r"\W")
_COMPARISON = re.compile(r"[!=]{2}")
# What each pattern needs, beyond its literal: every one needs an opening quote before a word character (its SECRET
# starts with one), and the separator before its quote (`:`, `=`, `=>`, blanks between) or a `;` after it.
_QUOTE_WORD = re.compile(r"['\"`]\w")
_COLON_QUOTE = re.compile(r":\s*['\"`]")
_EQUAL_QUOTE = re.compile(r"=\s*['\"`]")
_ARROW_QUOTE = re.compile(r"=>?\s*['\"`]")
_QUOTE_SEMICOLON = re.compile(r"['\"`];")


@lru_cache(maxsize=1)
def _patterns() -> tuple[
    tuple[str, ...], tuple[tuple[re.Pattern, int, tuple[str, re.Pattern] | re.Pattern], ...]
]:
    """(the DENYLIST words spelled out, (pattern, its group, (the literal it needs, its quote's pattern), or for the
    comparison the pattern of its tail))."""
    from detect_secrets.plugins import keyword

    words = set()
    for word in keyword.DENYLIST:
        if re.sub(r"_\?", "", word) != re.escape(re.sub(r"_\?", "", word)):
            raise RuntimeError(
                f"detect-secrets DENYLIST entry {word!r} is more than words and '_?'"
            )
        words |= {word.replace("_?", "_"), word.replace("_?", "")}
    needs = {
        keyword.FOLLOWED_BY_COLON_QUOTES_REQUIRED_REGEX: (":", _COLON_QUOTE),
        keyword.FOLLOWED_BY_EQUAL_SIGNS_QUOTES_REQUIRED_REGEX: ("=", _EQUAL_QUOTE),
        keyword.FOLLOWED_BY_QUOTES_AND_SEMICOLON_REGEX: (";", _QUOTE_SEMICOLON),
        keyword.FOLLOWED_BY_ARROW_FUNCTION_SIGN_QUOTES_REQUIRED_REGEX: ("=", _ARROW_QUOTE),
        keyword.PRECEDED_BY_EQUAL_COMPARISON_SIGNS_QUOTES_REQUIRED_REGEX: None,
    }
    table = keyword.QUOTES_REQUIRED_DENYLIST_REGEX_TO_GROUP
    compared = keyword.PRECEDED_BY_EQUAL_COMPARISON_SIGNS_QUOTES_REQUIRED_REGEX
    tail = r"{ws}[!=]{{2,3}}{ws}{denylist}".format(
        ws=keyword.OPTIONAL_WHITESPACE, denylist=keyword.DENYLIST_REGEX_WITH_PREFIX
    )
    if (
        set(table) != set(needs)
        or table[compared] != 2
        or compared.flags & re.IGNORECASE
        or compared.pattern != r"({q})({s})(\1)".format(q=keyword.QUOTE, s=keyword.SECRET) + tail
        or keyword.SECRET != r"(?=[^\v\'\"]*)(?=\w+)[^\v\'\"]*[^\v,\'\"`]"
        or keyword.QUOTE != r'[\'"`]'
    ):
        raise RuntimeError(
            "detect-secrets' keyword patterns changed: memctl.redact.keyword needs a look"
        )
    return tuple(sorted(words)), tuple(
        (pattern, group, needs[pattern] or re.compile(tail)) for pattern, group in table.items()
    )


def _contained() -> set[tuple[str, str]]:
    """Pairs (word, inner word) where the inner word sits inside the word after its start and ends before its end:
    must be empty for the first-start rule above."""
    words = _patterns()[0]
    return {
        (w, v)
        for w in words
        for v in words
        if any(w.startswith(v, i) and i + len(v) < len(w) for i in range(1, len(w)))
    }


def starts(text: str, low: str | None = None) -> list[int]:
    """Every position of the text where a DENYLIST word starts (case as re.IGNORECASE sees it), in order.
    `low` is text.lower(), used as the folded copy when the text is ASCII."""
    fold = (low if low is not None else text.lower()) if text.isascii() else text.translate(FOLD)
    found = set()
    for word in _patterns()[0]:
        at = fold.find(word)
        while at >= 0:
            found.add(at)
            at = fold.find(word, at + 1)
    return sorted(found)


def values(text: str, start: int, end: int, word_starts: list[int]) -> set[str]:
    """What KeywordDetector().analyze_string(text[start:end]) reports, as a set. `word_starts` is starts(text)."""
    found: set[str] = set()
    if _QUOTE_WORD.search(text, start, end) is None:
        return found
    first, previous = [], -1
    for at in word_starts[
        bisect.bisect_left(word_starts, start) : bisect.bisect_left(word_starts, end)
    ]:
        if previous < 0 or _NOT_WORD.search(text, previous, at) is not None:
            first.append(at)
        previous = at
    for pattern, group, needs in _patterns()[1]:
        if not isinstance(needs, tuple):
            if end - start <= _SHORT:  # a short line: its own search, at most _SHORT squared steps
                match = pattern.search(text, start, end)
                if match is not None:
                    found.add(match.group(group))
                continue
            value = _compared(text, start, end, needs)
            if value is not None:
                found.add(value)
            continue
        if text.find(needs[0], start, end) < 0 or needs[1].search(text, start, end) is None:
            continue
        tries = first
        if needs[0] == ";" and end - start > _SHORT:
            tries = _semicolon_starts(text, start, end, first)
        match = next((m for at in tries if (m := pattern.match(text, at, end)) is not None), None)
        if match is not None:
            found.add(match.group(group))
    return found


_WORD_RUN = re.compile(r"\w*")
_SPACE = re.compile(r"\s")
_SPACES = re.compile(r"\s*")
_LAZY = 50  # the semicolon pattern's `[^\s]{0,50}?` between its name and its quote
# A window this short (a line) is tried from each start as it is, and searched as it is for the comparison pattern:
# its attempts cost at most its length times _LAZY steps (its length squared), less than looking for openings or
# closing quotes (hostile text of short lines each holding `pwd'1';` or `'1' == pwd`).
_SHORT = 24


def _semicolon_starts(text: str, start: int, end: int, first: list[int]) -> list[int]:
    """The word starts from which the semicolon pattern (`password foo "bar";`) can match: its own match costs
    tens of us a start (`[^\\s]{0,50}?` tried after each length of `\\w*`), so a start is tried only when an opening
    quote it can use lies within its reach: after its run of word characters and at most 50 other non-blank
    characters, or right after the blanks that follow them."""
    closing: dict[str, list[int]] = {"'": [], '"': [], "`": []}
    for m in _QUOTE_SEMICOLON.finditer(text, start, end):
        if m.start() - 1 > start and text[m.start() - 1] not in "\v,'\"`":
            closing[m.group()[0]].append(m.start())
    openings = [at for at, _ in _openings(text, start, end, closing)]
    if not openings:
        return []
    tries = []
    for at in first:
        word = _WORD_RUN.match(text, at, end)
        assert word is not None  # it matches the empty string
        reach = min(word.end() + _LAZY, end)
        blank = _SPACE.search(text, at, min(reach + 1, end))
        last = blank.start() - 1 if blank is not None else reach
        index = bisect.bisect_right(openings, at)
        if index < len(openings) and openings[index] <= last:
            tries.append(at)
        elif blank is not None:
            spaces = _SPACES.match(text, blank.start(), end)
            assert spaces is not None  # it matches the empty string
            after = spaces.end()
            index = bisect.bisect_left(openings, after)
            if index < len(openings) and openings[index] == after:
                tries.append(at)
    return tries


def _openings(text: str, start: int, end: int, closing: dict[str, list[int]]):
    """(opening quote, the last closing quote its SECRET can end at) for each opening quote in text[start:end] in
    order that has one among `closing` (per quote character, sorted): a word character after it, as SECRET starts;
    SECRET runs to the next ' " or vertical tab; a ' or " closes it only there, a backtick at any backtick before."""
    if not any(closing.values()):
        return
    stops = [m.start() for m in _SECRET_STOP.finditer(text, start, end)]
    for m in _QUOTE_WORD.finditer(text, start, end):
        at, quote = m.start(), m.group()[0]
        index = bisect.bisect_right(stops, at)
        stop = stops[index] if index < len(stops) else end
        ends = closing[quote]
        if quote != "`":
            index = bisect.bisect_left(ends, stop)
            if index < len(ends) and ends[index] == stop and stop >= at + 2:
                yield at, stop
        else:
            index = bisect.bisect_left(ends, stop) - 1
            if index >= 0 and ends[index] >= at + 2:
                yield at, ends[index]


_QUOTE_BEFORE_COMPARISON = re.compile(r"['\"`](?=\s*[!=]{2})")
_SECRET_STOP = re.compile("['\"\v]")


def _compared(text: str, start: int, end: int, tail: re.Pattern) -> str | None:
    """The value the plugin's fifth pattern, `(Q)(SECRET)(\\1)` then `tail` (`\\s*[!=]{2,3}\\s*\\w*WORD\\w*`), reports
    in text[start:end]: `"hunter2" == password`.

    Its own search backtracks from each quote over the rest of the window. Here: the closing quotes after which
    `tail` matches are found once (a tail holds no quote, so each is matched once); the first opening quote that
    has one (`_openings`) is the leftmost match, and its last closing quote the greedy SECRET's end."""
    if _COMPARISON.search(text, start, end) is None:
        return None
    closing: dict[str, list[int]] = {"'": [], '"': [], "`": []}
    for m in _QUOTE_BEFORE_COMPARISON.finditer(text, start, end):
        at = m.start()
        if (
            at - 1 > start
            and text[at - 1] not in "\v,'\"`"
            and tail.match(text, at + 1, end) is not None
        ):
            closing[text[at]].append(at)
    for at, stop in _openings(text, start, end, closing):
        return text[at + 1 : stop]
    return None
