"""Numbers in documents (financial analysis): tolerance matches, labelled values, consistency."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any, ClassVar

from rewards.criteria._common import EXPECTED_SCHEMA, expected_value
from rewards.extract import ANSWER_PATTERN_SCHEMA, EXTRACT_SCHEMA, NUMBER, extract_answer
from rewards.numeric import ParsedNumber, equal_numbers, parse_number
from rewards.registry import Criterion, ParamProblem, register
from rewards.types import CriterionError, Outcome, Sample

TOLERANCE_PROPERTIES: dict[str, Any] = {
    "abs_tol": {"type": "number", "minimum": 0, "description": "absolute tolerance"},
    "rel_tol": {
        "type": "number",
        "minimum": 0,
        "description": "relative tolerance (0.01 = within 1%)",
    },
}


def _number_in(text: str) -> ParsedNumber | None:
    """The number a short answer states, else the last number in it."""
    parsed = parse_scaled(text) or parse_number(text)
    if parsed is not None:
        return parsed
    matches = list(NUMBER.finditer(text))
    if not matches:
        return None
    last = matches[-1]
    base = parse_number(last.group(0).replace(" ", ""))
    if base is None:
        return None
    tail = text[last.end() : last.end() + 20]
    head = text[max(0, last.start() - 4) : last.start()]
    percent = bool(re.match(r"\s*(?:\\?%|percent)", tail, re.I))
    scale = re.match(r"\s*(thousand|million|billion|trillion|bn)\b", tail, re.I)
    if scale is None and re.search(r"[$€£¥]\s*$", head):
        scale = re.match(r"\s*(k|m|mn|b)\b", tail, re.I)
    value = base.value
    if scale:
        value *= _MULTIPLIERS.get(scale.group(1).lower(), 10**12)
    return ParsedNumber(value, percent)


def _expected_number(value: Any) -> ParsedNumber:
    if isinstance(value, bool):
        raise CriterionError(f"expected value {value!r} is not a number")
    if isinstance(value, int):
        return ParsedNumber(Fraction(value))
    if isinstance(value, float):
        return ParsedNumber(Fraction(repr(value)))
    parsed = parse_number(str(value))
    if parsed is None:
        raise CriterionError(f"expected value {value!r} is not a number")
    return parsed


@register
class NumericMatch(Criterion):
    """Scores 1 when the answer's number is within tolerance of the expected number.

    The answer is found by ``extract`` (default ``auto``: boxed, answer tag, "answer:" marker,
    else the last number in the response). Numbers may carry thousands separators, currency,
    percent signs (``12%`` matches 12 and 0.12) or a unit word. Equal when
    ``|got − expected| ≤ abs_tol`` or ``≤ rel_tol·max(|got|, |expected|)``; both default to
    exact equality. With ``"credit": "linear"`` the score falls linearly from 1 at the
    tolerance to 0 at ``zero_at_rel_error`` relative error (default 0.1).
    """

    kind = "numeric_match"
    summary = "The answer's number is within an absolute/relative tolerance of the expected."
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "expected": EXPECTED_SCHEMA,
            "extract": EXTRACT_SCHEMA,
            "answer_pattern": ANSWER_PATTERN_SCHEMA,
            **TOLERANCE_PROPERTIES,
            "credit": {"type": "string", "enum": ["binary", "linear"]},
            "zero_at_rel_error": {"type": "number", "exclusiveMinimum": 0},
        },
    }

    def evaluate(self, sample: Sample) -> Outcome:
        expected = _expected_number(expected_value(self.params, sample))
        mode = self.params.get("extract", "auto")
        region = extract_answer(sample.response, mode, self.params.get("answer_pattern"))
        got = _number_in(region) if region is not None else None
        if got is None and mode == "auto":
            got = _number_in(sample.response)
        if got is None:
            return Outcome(0.0, {"extracted": region, "reason": "no number found"})
        abs_tol = float(self.params.get("abs_tol", 0.0))
        rel_tol = float(self.params.get("rel_tol", 0.0))
        details = {"extracted": float(got.value), "expected": float(expected.value)}
        if equal_numbers(got, expected, rel_tol, abs_tol):
            return Outcome(1.0, details)
        if self.params.get("credit") == "linear":
            zero_at = float(self.params.get("zero_at_rel_error", 0.1))
            scale = max(abs(expected.value), Fraction(1, 10**12))
            error = float(abs(got.value - expected.value) / scale)
            score = max(0.0, 1.0 - max(0.0, error - rel_tol) / max(zero_at - rel_tol, 1e-12))
            return Outcome(score, {**details, "rel_error": error})
        return Outcome(0.0, details)


# "Revenue: $1,234", "Revenue was 1,234", "revenue of $1.2m", "Revenue = 1234"
_VALUE = (
    r"((?:[-−]\s*)?(?:[$€£¥]|USD|EUR|GBP)?\s*[-−]?\s*(?:\d{1,3}(?:[, ]\d{3})+|\d+)(?:\.\d+)?"
    r"\s*(?:%|percent|[kKmMbB]n?\b|million|billion|thousand)?)"
)
_VERB = r"(?:[:=]|\bwas\b|\bis\b|\bof\b|\bat\b|\bto\b|\btotal(?:l?ed)?\b)?"
_MULTIPLIERS = {"k": 10**3, "thousand": 10**3, "m": 10**6, "mn": 10**6, "million": 10**6,
                "b": 10**9, "bn": 10**9, "billion": 10**9}  # fmt: skip


def _value_pattern(label: str) -> re.Pattern[str]:
    words = r"\W+".join(re.escape(w) for w in label.split())
    # The label, up to 40 characters of words, an optional verb, then the value.
    prose = rf"\b{words}\b[^\n\d$€£¥\-−|]{{0,40}}?{_VERB}\s*\**\s*{_VALUE}"
    return re.compile(prose, re.IGNORECASE)


def _table_values(text: str, label: str) -> list[tuple[int, str]]:
    """(offset, value) for markdown table rows whose first cell is the label; the value is
    the row's last numeric cell (tables put the latest period last)."""
    found = []
    wanted = " ".join(label.casefold().split())
    offset = 0
    for line in text.splitlines(keepends=True):
        if line.count("|") >= 2:
            cells = [c.strip().strip("*").strip() for c in line.strip().strip("|").split("|")]
            if cells and " ".join(cells[0].casefold().split()) == wanted:
                numeric = [c for c in cells[1:] if parse_scaled(c) is not None]
                if numeric:
                    found.append((offset, numeric[-1]))
        offset += len(line)
    return found


def parse_scaled(text: str) -> ParsedNumber | None:
    """A number that may carry a scale word: ``$1.2m``, ``3 billion``, ``45k``."""
    cleaned = text.strip().replace("\u2212", "-")
    match = re.match(r"^(.*?\d)\s*(k|m|mn|b|bn|thousand|million|billion)\b\.?$", cleaned, re.I)
    if match:
        base = parse_number(match.group(1), allow_units=False)
        if base is None:
            return None
        return ParsedNumber(base.value * _MULTIPLIERS[match.group(2).lower()], base.percent)
    return parse_number(cleaned, allow_units=False)


def find_labelled_values(text: str, label: str) -> list[ParsedNumber]:
    """Every value stated for ``label`` in prose or a markdown table, in order of appearance."""
    found: list[tuple[int, ParsedNumber]] = []
    for offset, raw in _table_values(text, label):
        parsed = parse_scaled(raw)
        if parsed is not None:
            found.append((offset, parsed))
    for match in _value_pattern(label).finditer(text):
        line_start = text.rfind("\n", 0, match.start()) + 1
        line_end = text.find("\n", match.start())
        line = text[line_start : line_end if line_end != -1 else len(text)]
        if line.count("|") >= 2:
            continue  # table rows are read cell by cell above
        parsed = parse_scaled(match.group(1))
        if parsed is not None:
            found.append((match.start(), parsed))
    return [value for _, value in sorted(found, key=lambda item: item[0])]


_LABELS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "minProperties": 1,
    "additionalProperties": {
        "anyOf": [
            {"type": "number"},
            {"type": "string"},
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["expected"],
                "properties": {
                    "expected": {"type": ["number", "string"]},
                    "aliases": {"type": "array", "items": {"type": "string", "minLength": 1}},
                    **TOLERANCE_PROPERTIES,
                },
            },
        ]
    },
    "description": "label → expected value, or {expected, aliases, abs_tol, rel_tol}",
}


@register
class LabelledValues(Criterion):
    """Scores the fraction of labelled values the response states correctly.

    ``values`` maps a label ("Revenue", "Net margin") to its expected value, or to
    ``{"expected", "aliases", "abs_tol", "rel_tol"}``; without ``values`` the sample's
    ``ground_truth`` must be such a mapping. A value is read from prose ("Revenue was
    $1.2m", "net margin: 12.5%") or from a markdown table row whose first cell is the label
    (``| Revenue | 1,200,000 |``); scale words (k, m, bn, million, billion) are applied. When a
    label is stated several times the last statement counts (use ``consistency`` to punish
    contradictions). Default tolerance: ``rel_tol`` 0.005.
    """

    kind = "labelled_values"
    summary = "Fraction of labelled values (prose or markdown table) stated correctly."
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"values": _LABELS_SCHEMA, **TOLERANCE_PROPERTIES},
    }

    def evaluate(self, sample: Sample) -> Outcome:
        wanted = self.params.get("values")
        if wanted is None:
            wanted = sample.ground_truth
        if not isinstance(wanted, dict) or not wanted:
            raise CriterionError("no labelled values: give params.values or a dict ground_truth")
        text = sample.response
        per_label: dict[str, Any] = {}
        correct = 0
        for label, spec in wanted.items():
            spec = spec if isinstance(spec, dict) else {"expected": spec}
            expected = _expected_number(spec["expected"])
            abs_tol = float(spec.get("abs_tol", self.params.get("abs_tol", 0.0)))
            rel_tol = float(spec.get("rel_tol", self.params.get("rel_tol", 0.005)))
            found: list[ParsedNumber] = []
            for name in [label, *spec.get("aliases", [])]:
                found = find_labelled_values(text, name)
                if found:
                    break
            if not found:
                per_label[label] = {"found": None, "ok": False}
                continue
            ok = equal_numbers(found[-1], expected, rel_tol, abs_tol)
            correct += ok
            per_label[label] = {"found": float(found[-1].value), "expected": float(expected.value),
                                "ok": ok}  # fmt: skip
        return Outcome(correct / len(wanted), {"values": per_label})


@register
class Consistency(Criterion):
    """Scores 1 when every quantity stated more than once is stated with the same value.

    ``labels`` lists the quantities to follow (with the same reading rules as
    ``labelled_values``); the score is the fraction of labels stated more than once whose
    statements all agree within ``rel_tol`` (default 0.005) — a response that says revenue
    grew to $1.2m in one paragraph and $1.5m in another loses that label. Labels stated at
    most once count as consistent; with ``require_all`` they must be stated at least once.
    """

    kind = "consistency"
    summary = "The same quantity stated in different paragraphs agrees with itself."
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "required": ["labels"],
        "properties": {
            "labels": {
                "type": "array",
                "minItems": 1,
                "items": {"type": "string", "minLength": 1},
            },
            "require_all": {"type": "boolean"},
            **TOLERANCE_PROPERTIES,
        },
    }

    @classmethod
    def check_params(cls, params: dict[str, Any]) -> list[ParamProblem]:
        labels = params.get("labels", [])
        lowered = [label.casefold() for label in labels]
        return [
            (f"labels[{i}]", "repeats an earlier label")
            for i, label in enumerate(lowered)
            if label in lowered[:i]
        ]

    def evaluate(self, sample: Sample) -> Outcome:
        rel_tol = float(self.params.get("rel_tol", 0.005))
        abs_tol = float(self.params.get("abs_tol", 0.0))
        text = sample.response
        per_label: dict[str, Any] = {}
        good = 0
        for label in self.params["labels"]:
            values = find_labelled_values(text, label)
            if not values:
                ok = not self.params.get("require_all", False)
            else:
                first = values[0]
                ok = all(equal_numbers(v, first, rel_tol, abs_tol) for v in values[1:])
            good += ok
            per_label[label] = {"values": [float(v.value) for v in values], "consistent": ok}
        return Outcome(good / len(self.params["labels"]), {"labels": per_label})
