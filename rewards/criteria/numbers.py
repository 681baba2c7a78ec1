"""Numbers in documents (financial analysis): tolerance matches, labelled values, consistency.

Numbers are read as an analyst reads them (`rewards.amounts`): accounting parentheses and a
minus before the currency are negative, scale words and abbreviations apply (k, m, mm, MM,
mn, bn, tn, bps …), and years, fiscal periods, footnote markers and page references are
labels, not answers.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any, ClassVar

from rewards.amounts import Amount, Choice, choose_answer, read_amounts, read_single_amount
from rewards.criteria._common import EXPECTED_SCHEMA, expected_value
from rewards.extract import ANSWER_PATTERN_SCHEMA, EXTRACT_SCHEMA, extract_answer
from rewards.numeric import ParsedNumber, close, equal_numbers, parse_number
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
_PLAIN_NUMBER = re.compile(r"-?\d{1,15}(?:\.\d{1,15})?")
PERCENT_SCHEMA: dict[str, Any] = {
    "type": "string",
    "enum": ["either", "fraction", "number"],
    "description": "how a percentage compares with a plain number: either (default: 3.5% "
    "matches 3.5 and 0.035), fraction (3.5% is 0.035 only), number (3.5% is 3.5 only)",
}


def _parsed(amount: Amount, value: Fraction | None = None) -> ParsedNumber:
    return ParsedNumber(amount.value if value is None else value, amount.percent)


def same_number(
    got: ParsedNumber, expected: ParsedNumber, rel_tol: float, abs_tol: float, percent: str
) -> bool:
    """Whether two numbers agree under the tolerances and the ``percent`` rule."""
    if percent == "either" or got.percent == expected.percent:
        return equal_numbers(got, expected, rel_tol, abs_tol)
    if percent == "fraction":
        left = got.value / 100 if got.percent else got.value
        right = expected.value / 100 if expected.percent else expected.value
        return close(left, right, rel_tol, abs_tol)
    return close(got.value, expected.value, rel_tol, abs_tol)


def read_answer(
    text: str, cued: bool, short_scales: str = "auto"
) -> tuple[ParsedNumber | None, list[ParsedNumber], Choice]:
    """The number a response's answer region states, the other readings it allows (for an
    ambiguous answer) and how it was chosen."""
    if _PLAIN_NUMBER.fullmatch(text):  # the common case, "#### 42": no reading to do
        # parse_number's cache is shared with math_equivalence, which read the same text.
        plain = parse_number(text)
        if plain is not None:
            return plain, [], Choice(None)
    others: list[ParsedNumber] = []
    single = read_single_amount(text, short_scales)
    if single is not None:
        if single.other_reading is not None:
            others.append(ParsedNumber(single.other_reading, single.percent))
        return _parsed(single), others, choose_answer(text, cued, short_scales)
    amounts = read_amounts(text, short_scales)
    if not amounts or len(text) <= 60:
        # \frac{3}{4}, 3/4, 2 \times 10^{3}: forms a plain reading splits apart.
        parsed = parse_number(text)
        if parsed is not None:
            return parsed, [], Choice(None)
    choice = choose_answer(text, cued, short_scales)
    if choice.amount is None:
        return None, [], choice
    chosen = choice.amount
    if chosen.other_reading is not None:
        others.append(ParsedNumber(chosen.other_reading, chosen.percent))
    if choice.ambiguous and chosen.other_reading is None:
        for amount in amounts:
            if amount is not chosen and not amount.is_label and amount.text in choice.ambiguous:
                others.append(_parsed(amount))
        value = chosen.value
        scales = [a.scale for a in amounts if a.text in choice.ambiguous]
        if chosen.scale == 1 and max(scales, default=1) > 1:
            value = chosen.value * max(scales)  # "$1.2–1.5 billion": 1.2 billion
        percent = chosen.percent or any(o.percent for o in others)
        return ParsedNumber(value, percent), others, choice
    return _parsed(chosen), others, choice


def _expected_number(value: Any) -> ParsedNumber:
    if isinstance(value, bool):
        raise CriterionError(f"expected value {value!r} is not a number")
    if isinstance(value, int):
        return ParsedNumber(Fraction(value))
    if isinstance(value, float):
        return ParsedNumber(Fraction(repr(value)))
    text = str(value)
    if _PLAIN_NUMBER.fullmatch(text):
        plain = parse_number(text)
        if plain is not None:
            return plain
    amount = read_single_amount(text)
    if amount is not None and amount.other_reading is None:
        return _parsed(amount)
    parsed = parse_number(text)
    if parsed is None:
        raise CriterionError(f"expected value {value!r} is not a number")
    return parsed


@register
class NumericMatch(Criterion):
    """Scores 1 when the answer's number is within tolerance of the expected number.

    The answer region is found by ``extract`` (default ``auto``: boxed, answer tag,
    "answer:"/"####" marker, else the whole response). In it, numbers are read as an analyst
    reads them (see `rewards.amounts`): ``(1,234)`` and ``-$500k`` are negative, ``$1.2m``,
    ``3.5B``, ``50 bps`` are scaled, and years, fiscal periods (``FY2023``, ``Q3 2024``),
    footnote markers and page references are skipped. After an answer cue the first number
    counts; with no cue the last. ``percent`` says how ``3.5%`` compares with ``0.035``.
    Equal when ``|got − expected| ≤ abs_tol`` or ``≤ rel_tol·max(|got|, |expected|)``; both
    default to exact equality. With ``"credit": "linear"`` the score falls linearly from 1 at
    the tolerance to 0 at ``zero_at_rel_error`` relative error (default 0.1).

    An answer that can be read two ways with different verdicts (``5 m`` with no currency,
    ``12 or 15``, a range ``$1.2–1.5bn``) scores ``ambiguous_score`` (default 0) with
    ``details.confidence = "low"`` and the readings, never full reward. ``short_scales``
    settles ``5 m`` for a domain: ``always`` (figures: five million) or ``never`` (measures:
    five metres).
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
            "percent": PERCENT_SCHEMA,
            "credit": {"type": "string", "enum": ["binary", "linear"]},
            "zero_at_rel_error": {"type": "number", "exclusiveMinimum": 0},
            "ambiguous_score": {"type": "number", "minimum": 0, "maximum": 1},
            "short_scales": {
                "type": "string",
                "enum": ["auto", "always", "never"],
                "description": "k/m/b/t after a number: auto (scale when written against "
                "it or after a currency; '5 m' alone is ambiguous), always (figures), never "
                "(measures: 5 m is five metres)",
            },
        },
    }

    def evaluate(self, sample: Sample) -> Outcome:
        expected = _expected_number(expected_value(self.params, sample))
        mode = self.params.get("extract", "auto")
        pattern = self.params.get("answer_pattern")
        text = sample.response
        if mode in ("last_number", "full") and pattern is None:
            region: str | None = text
            cued = False
        else:
            region = extract_answer(text, mode, pattern)
            cued = region is not None and (
                pattern is not None or mode != "auto" or region != text.strip()
            )
        short = self.params.get("short_scales", "auto")
        got, others, choice = (
            (None, [], Choice(None)) if region is None else read_answer(region, cued, short)
        )
        if got is None and mode == "auto" and cued:
            got, others, choice = read_answer(text, False, short)
        if got is None:
            return Outcome(0.0, {"extracted": region, "reason": "no number found"})
        abs_tol = float(self.params.get("abs_tol", 0.0))
        rel_tol = float(self.params.get("rel_tol", 0.0))
        percent = self.params.get("percent", "either")
        details: dict[str, Any] = {"extracted": float(got.value), "expected": float(expected.value)}
        if got.percent:
            details["extracted_percent"] = True
        if choice.skipped:
            details["skipped"] = list(choice.skipped)[:10]
        verdict = same_number(got, expected, rel_tol, abs_tol, percent)
        if others and any(
            same_number(o, expected, rel_tol, abs_tol, percent) != verdict for o in others
        ):
            details.update(
                confidence="low",
                reason=f"ambiguous answer: {choice.ambiguous or 'two readings'}",
                readings=[float(got.value), *(float(o.value) for o in others)],
            )
            return Outcome(float(self.params.get("ambiguous_score", 0.0)), details)
        if verdict:
            return Outcome(1.0, details)
        if self.params.get("credit") == "linear":
            zero_at = float(self.params.get("zero_at_rel_error", 0.1))
            scale = max(abs(expected.value), Fraction(1, 10**12))
            error = float(abs(got.value - expected.value) / scale)
            score = max(0.0, 1.0 - max(0.0, error - rel_tol) / max(zero_at - rel_tol, 1e-12))
            return Outcome(score, {**details, "rel_error": error})
        return Outcome(0.0, details)


# How far after its label a value may stand ("Revenue for the year was $1.2m").
MAX_GAP = 48


def _label_pattern(label: str) -> re.Pattern[str]:
    words = r"\W+".join(re.escape(w) for w in label.split())
    return re.compile(rf"\b{words}\b", re.IGNORECASE)


def _table_values(text: str, label: str) -> list[tuple[int, Amount]]:
    """(offset, value) for markdown table rows whose first cell is the label; the value is
    the row's last numeric cell (tables put the latest period last)."""
    found = []
    wanted = " ".join(label.casefold().split())
    offset = 0
    for line in text.splitlines(keepends=True):
        if line.count("|") >= 2:
            cells = [c.strip().strip("*").strip() for c in line.strip().strip("|").split("|")]
            if cells and " ".join(cells[0].casefold().split()) == wanted:
                read = [read_single_amount(cell, "always") for cell in cells[1:]]
                numeric = [amount for amount in read if amount is not None]
                if numeric:
                    found.append((offset, numeric[-1]))
        offset += len(line)
    return found


_TO_FIGURE = re.compile(
    r"\s*,?\s*(?:to|at|reaching|for a total of)\s+"
    r"(?:US\$|(?:USD|EUR|GBP|JPY|CHF|CAD|AUD|INR|CNY)\s*|[$€£¥₹(\u2212\u2013-])*",
    re.I,
)


def _prose_value(window: str) -> Amount | None:
    """The value a label's sentence gives it: the first amount within `MAX_GAP` characters
    (years and other labels skipped); in "grew 15% to $5m" the figure, not the growth."""
    # Next to a label, "5 m" is five million: these are a document's figures.
    amounts = [a for a in read_amounts(window, "always") if not a.is_label and a.start <= MAX_GAP]
    if not amounts:
        return None
    first = amounts[0]
    if first.percent and len(amounts) > 1:
        between = window[first.end : amounts[1].start]
        if _TO_FIGURE.fullmatch(between):
            return amounts[1]
    return first


def find_labelled_values(
    text: str, label: str, longer_labels: tuple[str, ...] = ()
) -> list[ParsedNumber]:
    """Every value stated for ``label`` in prose or a markdown table, in order of appearance.
    An occurrence inside one of ``longer_labels`` ("Product revenue" for "Revenue") is not
    this label."""
    found: list[tuple[int, Amount]] = list(_table_values(text, label))
    inside = [m.span() for other in longer_labels for m in _label_pattern(other).finditer(text)]
    for match in _label_pattern(label).finditer(text):
        if any(start <= match.start() and match.end() <= end for start, end in inside):
            continue
        line_start = text.rfind("\n", 0, match.start()) + 1
        line_end = text.find("\n", match.end())
        line_end = len(text) if line_end == -1 else line_end
        if text[line_start:line_end].count("|") >= 2:
            continue  # table rows are read cell by cell above
        # A sentence may wrap onto the next line; a blank line or a table ends it.
        window = re.split(r"\n\s*\n|\n\s*\|", text[match.end() : match.end() + 160])[0]
        value = _prose_value(window)
        if value is not None:
            found.append((match.start(), value))
    return [_parsed(value) for _, value in sorted(found, key=lambda item: item[0])]


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


def _longer(label: str, others: list[str]) -> tuple[str, ...]:
    """The other labels that contain this one as words ("Product revenue" ⊃ "Revenue")."""
    pattern = _label_pattern(label)
    return tuple(o for o in others if len(o) > len(label) and pattern.search(o))


@register
class LabelledValues(Criterion):
    """Scores the fraction of labelled values the response states correctly.

    ``values`` maps a label ("Revenue", "Net margin") to its expected value, or to
    ``{"expected", "aliases", "abs_tol", "rel_tol"}``; without ``values`` the sample's
    ``ground_truth`` must be such a mapping. A value is read from prose ("Revenue was
    $1.2m", "net margin: 12.5%", "Net income: $(2.5) million") or from a markdown table row
    whose first cell is the label (``| Revenue | 1,200,000 |``), as an analyst reads it (see
    `rewards.amounts`: accounting negatives, k/m/mm/MM/bn/tn/bps, years and periods
    skipped). When a label is stated several times the last statement counts (use
    ``consistency`` to punish contradictions). Default tolerance: ``rel_tol`` 0.005;
    ``percent`` as for ``numeric_match``.
    """

    kind = "labelled_values"
    summary = "Fraction of labelled values (prose or markdown table) stated correctly."
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "values": _LABELS_SCHEMA,
            **TOLERANCE_PROPERTIES,
            "percent": PERCENT_SCHEMA,
        },
    }

    def evaluate(self, sample: Sample) -> Outcome:
        wanted = self.params.get("values")
        if wanted is None:
            wanted = sample.ground_truth
        if not isinstance(wanted, dict) or not wanted:
            raise CriterionError("no labelled values: give params.values or a dict ground_truth")
        text = sample.response
        percent = self.params.get("percent", "either")
        labels = list(wanted)
        per_label: dict[str, Any] = {}
        correct = 0
        for label, spec in wanted.items():
            spec = spec if isinstance(spec, dict) else {"expected": spec}
            expected = _expected_number(spec["expected"])
            abs_tol = float(spec.get("abs_tol", self.params.get("abs_tol", 0.0)))
            rel_tol = float(spec.get("rel_tol", self.params.get("rel_tol", 0.005)))
            found: list[ParsedNumber] = []
            for name in [label, *spec.get("aliases", [])]:
                found = find_labelled_values(text, name, _longer(name, labels))
                if found:
                    break
            if not found:
                per_label[label] = {"found": None, "ok": False}
                continue
            ok = same_number(found[-1], expected, rel_tol, abs_tol, percent)
            correct += ok
            per_label[label] = {"found": float(found[-1].value), "expected": float(expected.value),
                                "ok": ok}  # fmt: skip
        return Outcome(correct / len(wanted), {"values": per_label})


_TOTALS_SCHEMA: dict[str, Any] = {
    "type": "array",
    "minItems": 1,
    "items": {
        "type": "object",
        "additionalProperties": False,
        "required": ["total", "parts"],
        "properties": {
            "total": {"type": "string", "minLength": 1},
            "parts": {
                "type": "array",
                "minItems": 1,
                "items": {"type": "string", "minLength": 1},
            },
            **TOLERANCE_PROPERTIES,
        },
    },
    "description": "totals that must equal the sum of their parts: "
    "[{total, parts, abs_tol, rel_tol}]",
}


@register
class Consistency(Criterion):
    """Scores how consistent the figures of a document are with each other.

    ``labels`` lists quantities that must agree wherever they are stated: a response that
    says revenue grew to $1.2m in one paragraph and $1.5m in another loses that label (labels
    stated at most once count as consistent). ``totals`` lists totals that must equal the
    sum of their stated parts — line items and their total, segment revenues and the
    consolidated figure — wherever in the document (prose or tables) each is stated; the last
    statement of each counts, accounting negatives included (``Eliminations: (40)``). With
    ``require_all`` a label or total whose figures are not all stated fails; without it, it
    counts as consistent. The score is the fraction of labels and totals that hold, within
    ``rel_tol`` (default 0.005) or ``abs_tol`` (per total too). Figures are read as
    ``labelled_values`` reads them. Give ``labels``, ``totals`` or both.
    """

    kind = "consistency"
    summary = "Figures agree across paragraphs, and totals equal the sum of their parts."
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "labels": {
                "type": "array",
                "minItems": 1,
                "items": {"type": "string", "minLength": 1},
            },
            "totals": _TOTALS_SCHEMA,
            "require_all": {"type": "boolean"},
            **TOLERANCE_PROPERTIES,
        },
    }

    @classmethod
    def check_params(cls, params: dict[str, Any]) -> list[ParamProblem]:
        if not params.get("labels") and not params.get("totals"):
            return [("labels", "give labels, totals or both")]
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
        require_all = bool(self.params.get("require_all", False))
        text = sample.response
        labels = list(self.params.get("labels", []))
        per_label: dict[str, Any] = {}
        good = 0
        for label in labels:
            values = find_labelled_values(text, label, _longer(label, labels))
            if not values:
                ok = not require_all
            else:
                first = values[0]
                ok = all(equal_numbers(v, first, rel_tol, abs_tol) for v in values[1:])
            good += ok
            per_label[label] = {"values": [float(v.value) for v in values], "consistent": ok}
        per_total: list[dict[str, Any]] = []
        for spec in self.params.get("totals", []):
            ok, found = self._total_holds(text, spec, rel_tol, abs_tol, require_all)
            good += ok
            per_total.append({"total": spec["total"], "consistent": ok, **found})
        checks = len(labels) + len(per_total)
        details: dict[str, Any] = {}
        if labels:
            details["labels"] = per_label
        if per_total:
            details["totals"] = per_total
        return Outcome(good / checks, details)

    @staticmethod
    def _total_holds(
        text: str, spec: dict[str, Any], rel_tol: float, abs_tol: float, require_all: bool
    ) -> tuple[bool, dict[str, Any]]:
        names = [spec["total"], *spec["parts"]]
        stated: dict[str, ParsedNumber | None] = {}
        for name in names:
            values = find_labelled_values(text, name, _longer(name, names))
            stated[name] = values[-1] if values else None
        missing = [name for name, value in stated.items() if value is None]
        if missing:
            return not require_all, {"missing": missing}
        total = stated[spec["total"]]
        assert total is not None
        parts_sum = sum((stated[p].value for p in spec["parts"]), Fraction(0))  # type: ignore[union-attr]
        ok = close(
            parts_sum,
            total.value,
            float(spec.get("rel_tol", rel_tol)),
            float(spec.get("abs_tol", abs_tol)),
        )
        return ok, {"stated_total": float(total.value), "sum_of_parts": float(parts_sum)}
