"""Finding the final answer inside a model's response.

Every answer criterion takes an ``extract`` parameter naming one of `EXTRACTORS`, or an
``answer_pattern`` regex whose first group (or whole match) is the answer; the last match
wins, because models restate the question and revise themselves before concluding.
"""

from __future__ import annotations

import functools
from typing import Any

import regex

EXTRACT_MODES = ("auto", "boxed", "answer_tag", "marker", "last_number", "last_line", "full")

EXTRACT_SCHEMA: dict[str, Any] = {
    "type": "string",
    "enum": list(EXTRACT_MODES),
    "description": "where the answer is: auto (boxed, then <answer> tag, then 'answer:'/'####' "
    "marker, then the whole text), boxed (last \\boxed{}), answer_tag (last <answer>…</answer>), "
    "marker (text after the last 'answer is', 'answer:' or '####'), last_number, last_line, full",
}
ANSWER_PATTERN_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "description": "a regex; the answer is its first group (or the whole match) in the last match",
}

# Regexes compiled with a timeout: patterns and responses may both be hostile.
REGEX_TIMEOUT_S = 0.5

_BOXED_START = regex.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_TAG = regex.compile(r"<answer>(.*?)</answer>", regex.DOTALL | regex.IGNORECASE)
_MARKER = regex.compile(
    r"(?:final\s+answer(?:\s+is)?\s*:?|the\s+answer\s+is\s*:?|answer\s*:|####)\s*(.+?)\s*(?:$|\n\n)",
    regex.IGNORECASE,
)
NUMBER = regex.compile(
    r"[-−]?\s*(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-−]?\.\d+(?:[eE][-+]?\d+)?"
)


def boxed_contents(text: str) -> list[str]:
    """The contents of every ``\\boxed{...}`` (braces balanced), in order."""
    if "\\boxed" not in text and "\\fbox" not in text:
        return []
    found = []
    for match in _BOXED_START.finditer(text):
        depth, start = 1, match.end()
        for position in range(start, len(text)):
            char = text[position]
            if char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    found.append(text[start:position])
                    break
    return found


# Several criteria of one rubric read the same response: the second asks the cache (a str
# caches its own hash, so a hit costs one dictionary lookup).
@functools.lru_cache(maxsize=8192)
def extract_answer(text: str, mode: str = "auto", pattern: str | None = None) -> str | None:
    """The answer in ``text`` by ``mode`` (or ``pattern``), stripped; None when absent."""
    if pattern is not None:
        matches = list(compiled(pattern).finditer(text, timeout=REGEX_TIMEOUT_S))
        if not matches:
            return None
        last = matches[-1]
        return (last.group(1) if last.groups() else last.group(0)).strip()
    if mode in ("auto", "boxed"):
        boxed = boxed_contents(text)
        if boxed:
            return boxed[-1].strip()
        if mode == "boxed":
            return None
    # Substring tests first: most responses have none of the markers, and `in` is far
    # cheaper than a regex scan of the whole text.
    lowered = text.lower() if mode in ("auto", "answer_tag", "marker") else ""
    if mode in ("auto", "answer_tag") and "<answer>" in lowered:
        tags = _ANSWER_TAG.findall(text, timeout=REGEX_TIMEOUT_S)
        if tags:
            return tags[-1].strip()
    if mode == "answer_tag":
        return None
    if mode in ("auto", "marker") and ("answer" in lowered or "####" in text):
        markers = _MARKER.findall(text, timeout=REGEX_TIMEOUT_S)
        if markers:
            return markers[-1].strip().rstrip(".").strip()
    if mode == "marker":
        return None
    if mode == "last_number":
        numbers = NUMBER.findall(text, timeout=REGEX_TIMEOUT_S)
        return numbers[-1].replace(" ", "") if numbers else None
    if mode == "last_line":
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        return lines[-1] if lines else None
    stripped = text.strip()
    return stripped or None


@functools.lru_cache(maxsize=1024)
def compiled(pattern: str, flags: int = 0) -> Any:
    return regex.compile(pattern, flags)


def pattern_problem(pattern: str, flags: int = 0) -> str | None:
    """Why ``pattern`` does not compile, or None."""
    try:
        compiled(pattern, flags)
    except regex.error as exc:
        return f"is not a valid regular expression: {exc}"
    return None
