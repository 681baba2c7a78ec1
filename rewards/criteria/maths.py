"""Mathematical equivalence of final answers, through math-verify (SymPy) with a fast path."""

from __future__ import annotations

import functools
import logging
from typing import Any, ClassVar

from rewards.criteria._common import EXPECTED_SCHEMA, as_choices, expected_value
from rewards.extract import ANSWER_PATTERN_SCHEMA, EXTRACT_SCHEMA, NUMBER, extract_answer
from rewards.numeric import ParsedNumber, equal_numbers, parse_number
from rewards.registry import Criterion, register
from rewards.rubric import DeadlineExceeded
from rewards.types import CriterionError, Outcome, Sample
from rewards.workers import WorkerError, shared_pool

# math-verify reads only the end of long responses: the final answer is there, and SymPy
# parsing time grows with the text.
MAX_TAIL_CHARS = 4000


@register
class MathEquivalence(Criterion):
    """Scores 1 when the final answer is mathematically equal to the expected one, else 0.

    Accepts: ``\\boxed{}`` (last one), ``<answer>`` tags, "the answer is …"/"####" markers, or
    else the last expression in the text; LaTeX fractions (``\\frac{3}{4}``, ``\\dfrac34``),
    expressions and sets SymPy can compare (``\\sqrt{2}/2`` = ``\\frac{\\sqrt2}{2}``,
    ``x^2-1`` = ``(x-1)(x+1)``, intervals, ``\\{2,3\\}``); thousands separators (``1,234``,
    ``1\\,234``, ``1 234``); currency (``$5``, ``\\$5.00``); percentages (``45%`` equals
    45 and 0.45 — the sign is ambiguous in practice); a trailing unit word (``12 cm``,
    ``\\text{ cm}``); scientific notation (``2\\times10^{3}``). Numbers are equal when they
    agree to ``precision`` decimal places (default 6), as math-verify rounds.

    Plain numbers on both sides are compared exactly (fractions) without SymPy, which keeps
    this criterion fast; everything else goes to `math-verify`, with the criterion's
    ``timeout_s`` as its deadline. Answers longer than ``max_answer_chars`` score 0.
    """

    kind = "math_equivalence"
    summary = "The final answer equals the expected one mathematically (math-verify)."
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "expected": EXPECTED_SCHEMA,
            "extract": EXTRACT_SCHEMA,
            "answer_pattern": ANSWER_PATTERN_SCHEMA,
            "precision": {"type": "integer", "minimum": 0, "maximum": 15},
            "max_answer_chars": {"type": "integer", "minimum": 1, "maximum": 100000},
        },
    }
    default_timeout_s = 5.0

    def evaluate(self, sample: Sample) -> Outcome:
        precision = int(self.params.get("precision", 6))
        limit = int(self.params.get("max_answer_chars", 1000))
        mode = self.params.get("extract", "auto")
        pattern = self.params.get("answer_pattern")
        response = sample.response
        answer = extract_answer(response, mode, pattern)
        explicit = answer is not None and (
            pattern is not None or mode != "auto" or answer != response.strip()
        )
        standalone = True
        if not explicit:
            # No boxed/tag/marker: as math-verify does, the last number is the answer —
            # unless it is part of an expression ("x = 3/4", "\\frac{3}{4}"), which only the
            # symbolic path reads right.
            tail = response[-MAX_TAIL_CHARS:]
            numbers = list(NUMBER.finditer(tail))
            candidate = numbers[-1].group(0).replace(" ", "") if numbers else None
            if numbers:
                last = numbers[-1]
                standalone = _standalone(tail, last.start(), last.end())
                if tail[last.end() :].lstrip().startswith(("%", "\\%")):
                    candidate = f"{candidate}%"
        else:
            candidate = answer
        if candidate is not None and len(candidate) > limit:
            return Outcome(0.0, {"reason": f"answer longer than {limit} characters"})
        golds = [_gold_answer(g) for g in as_choices(expected_value(self.params, sample))]
        details: dict[str, Any] = {"extracted": candidate, "expected": golds}

        # Fast path: plain numbers on both sides decide without SymPy.
        got = parse_number(candidate) if candidate is not None and standalone else None
        if got is not None:
            parsed_golds = [parse_number(g) for g in golds]
            if all(p is not None for p in parsed_golds):
                tolerance = 0.5 * 10.0**-precision
                ok = any(
                    equal_numbers(got, g, rel_tol=1e-12, abs_tol=tolerance)
                    for g in parsed_golds
                    if isinstance(g, ParsedNumber)
                )
                return Outcome(1.0 if ok else 0.0, {**details, "method": "numeric"})

        text = (
            f"${candidate}$" if explicit and candidate is not None else response[-MAX_TAIL_CHARS:]
        )
        try:
            ok = shared_pool().call(
                __name__, "symbolic_equal_any", (golds, text, precision), self.context.timeout_s
            )
        except DeadlineExceeded as exc:
            raise CriterionError(f"math-verify {exc}") from exc
        except WorkerError as exc:
            raise CriterionError(f"math-verify failed: {exc}") from exc
        return Outcome(1.0 if ok else 0.0, {**details, "method": "symbolic"})


_OPERATORS = set("+-*/^_{}()[]\\|!×÷·")


def _standalone(text: str, start: int, end: int) -> bool:
    """Whether the number at text[start:end] stands alone rather than inside an expression
    ("3/4", "2^{10}", "3x", "f(3)"); "12 apples" and "x = 3." stand alone."""
    before = text[:start].rstrip()[-1:]
    right_after = text[end : end + 1]
    after = text[end:].lstrip()[:1]
    touches_operator = bool(before and before in _OPERATORS) or bool(after and after in _OPERATORS)
    return not (touches_operator or right_after.isalpha())


@functools.lru_cache(maxsize=65536)
def _gold_answer(gold: str) -> str:
    extracted = extract_answer(gold, "auto")
    return extracted if extracted is not None else gold.strip()


@functools.lru_cache(maxsize=4096)
def _parsed_gold(gold: str) -> Any:
    from math_verify import parse

    text = gold if "$" in gold or "\\boxed" in gold else f"${gold}$"
    parsed = parse(text, parsing_timeout=None)  # type: ignore[arg-type]
    if not parsed:
        parsed = parse(gold, parsing_timeout=None)  # type: ignore[arg-type]
    return parsed


def symbolic_equal_any(golds: list[str], text: str, precision: int) -> bool:
    """Runs in a worker process (see `rewards.workers`)."""
    return any(_symbolic_equal(gold, text, precision) for gold in golds)


def _symbolic_equal(gold: str, text: str, precision: int) -> bool:
    from math_verify import parse, verify

    gold_parsed = _parsed_gold(gold)
    if not gold_parsed:
        raise CriterionError(f"math-verify cannot read the expected answer {gold!r}")
    predicted = parse(_clean_latex(text), parsing_timeout=None)  # type: ignore[arg-type]
    if not predicted:
        return False
    return bool(
        verify(gold_parsed, predicted, float_rounding=precision, timeout_seconds=None)  # type: ignore[arg-type]
    )


def _clean_latex(text: str) -> str:
    # Spacing commands and escaped dollars confuse math-verify's number reading.
    return text.replace("\\,", "").replace("\\!", "").replace("\\$", "").replace("\\%", "%")


# math-verify warns once per process that we handle timeouts ourselves; we do.
logging.getLogger("math_verify").setLevel(logging.ERROR)
