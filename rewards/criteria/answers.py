"""Answer criteria: exact match, regex, multiple choice, mathematical equivalence."""

from __future__ import annotations

import re
import string
import unicodedata
from typing import Any, ClassVar

from rewards.criteria._common import EXPECTED_SCHEMA, as_choices, expected_value
from rewards.extract import (
    ANSWER_PATTERN_SCHEMA,
    EXTRACT_SCHEMA,
    REGEX_TIMEOUT_S,
    compiled,
    extract_answer,
    pattern_problem,
)
from rewards.registry import Criterion, ParamProblem, register
from rewards.types import CriterionError, Outcome, Sample

_WHITESPACE = re.compile(r"\s+")


def _normalise_text(text: str, *, case_sensitive: bool, strip_punctuation: bool) -> str:
    text = unicodedata.normalize("NFKC", text)
    text = _WHITESPACE.sub(" ", text).strip()
    if strip_punctuation:
        text = text.strip(string.punctuation + " ")
    if not case_sensitive:
        text = text.casefold()
    return text


@register
class ExactMatch(Criterion):
    """Scores 1 when the extracted answer equals the expected text, else 0.

    Comparison is after Unicode NFKC normalisation and collapsing whitespace; by default it
    ignores case and leading/trailing punctuation. ``expected`` may be a list of acceptable
    answers; it defaults to the sample's ``ground_truth``.

    Params: ``expected``, ``extract`` (default ``auto``), ``answer_pattern``,
    ``case_sensitive`` (false), ``strip_punctuation`` (true).
    """

    kind = "exact_match"
    summary = "The extracted answer equals the expected text (normalised)."
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "expected": EXPECTED_SCHEMA,
            "extract": EXTRACT_SCHEMA,
            "answer_pattern": ANSWER_PATTERN_SCHEMA,
            "case_sensitive": {"type": "boolean"},
            "strip_punctuation": {"type": "boolean"},
        },
    }

    @classmethod
    def check_params(cls, params: dict[str, Any]) -> list[ParamProblem]:
        problem = pattern_problem(params["answer_pattern"]) if "answer_pattern" in params else None
        return [("answer_pattern", problem)] if problem else []

    def evaluate(self, sample: Sample) -> Outcome:
        options = {
            "case_sensitive": self.params.get("case_sensitive", False),
            "strip_punctuation": self.params.get("strip_punctuation", True),
        }
        answer = extract_answer(
            sample.response, self.params.get("extract", "auto"), self.params.get("answer_pattern")
        )
        if answer is None:
            return Outcome(0.0, {"extracted": None, "reason": "no answer found"})
        expected = as_choices(expected_value(self.params, sample))
        got = _normalise_text(answer, **options)
        matched = any(got == _normalise_text(e, **options) for e in expected)
        return Outcome(1.0 if matched else 0.0, {"extracted": answer, "expected": expected})


_FLAG_NAMES = ("IGNORECASE", "MULTILINE", "DOTALL")


@register
class RegexMatch(Criterion):
    """Scores 1 when a regular expression matches the response (or the extracted answer).

    ``mode`` is ``search`` (anywhere; default) or ``fullmatch``; ``flags`` any of IGNORECASE,
    MULTILINE, DOTALL; ``target`` is ``response`` (default) or ``answer`` (after ``extract``);
    ``negate`` rewards the absence of a match (forbidden phrases). Matching uses the `regex`
    module with a time limit, so a catastrophic pattern scores 0 instead of hanging.
    """

    kind = "regex_match"
    summary = "A regular expression matches the response (or must not)."
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "required": ["pattern"],
        "properties": {
            "pattern": {"type": "string", "minLength": 1},
            "mode": {"type": "string", "enum": ["search", "fullmatch"]},
            "flags": {"type": "array", "items": {"type": "string", "enum": list(_FLAG_NAMES)}},
            "target": {"type": "string", "enum": ["response", "answer"]},
            "extract": EXTRACT_SCHEMA,
            "negate": {"type": "boolean"},
        },
    }

    @classmethod
    def _flags(cls, params: dict[str, Any]) -> int:
        import regex

        value = 0
        for name in params.get("flags", []):
            value |= getattr(regex, name)
        return value

    @classmethod
    def check_params(cls, params: dict[str, Any]) -> list[ParamProblem]:
        problem = pattern_problem(params["pattern"], cls._flags(params))
        return [("pattern", problem)] if problem else []

    def evaluate(self, sample: Sample) -> Outcome:
        text: str | None = sample.response
        if self.params.get("target") == "answer":
            text = extract_answer(sample.response, self.params.get("extract", "auto"))
            if text is None:
                return Outcome(0.0, {"reason": "no answer found"})
        assert text is not None
        pattern = compiled(self.params["pattern"], self._flags(self.params))
        try:
            if self.params.get("mode") == "fullmatch":
                match = pattern.fullmatch(text, timeout=REGEX_TIMEOUT_S)
            else:
                match = pattern.search(text, timeout=REGEX_TIMEOUT_S)
        except TimeoutError as exc:
            raise CriterionError(f"regex timed out after {REGEX_TIMEOUT_S}s") from exc
        hit = match is not None
        passed = hit != bool(self.params.get("negate", False))
        return Outcome(1.0 if passed else 0.0, {"matched": match.group(0)[:200] if match else None})


_CHOICE_PATTERNS = [
    # "answer is (B)", "Answer: B", "final answer: **B**"
    r"(?:answer\s*(?:is|:)|answer\s+is\s*:|correct\s+(?:option|choice|answer)\s+is)\s*"
    r"[\*\(\[\s]*({letters})\b",
    r"^\s*[\*\(\[]*({letters})[\)\]\.\*:]*\s*$",
]


@register
class MultipleChoice(Criterion):
    """Scores 1 when the response commits to the expected option letter, else 0.

    The answer is looked for in ``\\boxed{}``, ``<answer>`` tags, phrases like "the answer is
    (B)", then a line holding only a letter. A response that names more than one option in
    its answer ("A or C", "A, B, C, D") scores 0: hedging is not an answer. ``options`` may map
    letters to option texts so that the exact option text also counts.
    """

    kind = "multiple_choice"
    summary = "The response commits to the expected option letter."
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "expected": EXPECTED_SCHEMA,
            "letters": {
                "type": "array",
                "items": {"type": "string", "pattern": "^[A-Za-z0-9]$"},
                "minItems": 2,
                "uniqueItems": True,
            },
            "options": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    }

    def evaluate(self, sample: Sample) -> Outcome:
        letters = [s.upper() for s in self.params.get("letters", list("ABCDEFGHIJ"))]
        expected = str(expected_value(self.params, sample)).strip().upper()
        expected = expected.strip("()[]. ")
        chosen = self._chosen(sample.response, letters)
        if chosen is None:
            options = self.params.get("options", {})
            tail = sample.response.strip().casefold()
            for letter, text in options.items():
                if text and tail.endswith(
                    _normalise_text(text, case_sensitive=False, strip_punctuation=True)
                ):
                    chosen = {letter.upper()}
                    break
        if not chosen:
            return Outcome(0.0, {"chosen": None, "reason": "no option chosen"})
        if len(chosen) > 1:
            return Outcome(0.0, {"chosen": sorted(chosen), "reason": "more than one option"})
        (letter,) = chosen
        return Outcome(1.0 if letter == expected else 0.0, {"chosen": letter, "expected": expected})

    @staticmethod
    def _chosen(text: str, letters: list[str]) -> set[str] | None:
        alternation = "|".join(re.escape(letter) for letter in letters)
        region = extract_answer(text, "boxed") or extract_answer(text, "answer_tag")
        if region is not None:
            found = set(re.findall(rf"\b({alternation})\b", region.upper()))
            return found or None
        for template in _CHOICE_PATTERNS:
            pattern = re.compile(template.format(letters=alternation), re.I | re.M)
            matches = list(pattern.finditer(text))
            if matches:
                last = matches[-1]
                # A list right after the answer phrase ("A or C", "A, B, C, D") is hedging.
                listing = re.compile(
                    rf"[\)\]\*]*(?:\s*(?:,|/|&|\bor\b|\band\b)\s*[\*\(\[]*"
                    rf"(?:{alternation})\b[\)\]\*]*)*"
                ).match(text, last.end(1))
                named = {last.group(1).upper()}
                if listing:
                    named |= set(re.findall(rf"\b({alternation})\b", listing.group(0)))
                return named
        return None
