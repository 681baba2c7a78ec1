"""Reading amounts in financial prose the way an analyst reads them.

Every number in a text becomes an `Amount`: its value (exact), whether it is a percentage,
and what kind of number it is. The rules:

- Sign: ``(1,234)``, ``$(2.5) million``, ``($2.5m)`` and ``(12.5%)`` are negative
  (accounting parentheses); so is a minus before the currency symbol (``-$500k``, with a
  hyphen, an en dash ``–€3.2bn`` or a Unicode minus ``−$5``). A dash between two numbers
  (``2023-2024``, ``1.2–1.5``) is a range, never a sign.
- Scale: ``thousand``, ``million``, ``billion``, ``trillion``, ``mn``, ``MM``, ``bn``, ``tn``
  always scale; the short forms ``k K m M mm b B t T`` scale when written against the number
  (``$45k``, ``3.5B``) or after a currency (``$5 m``). Written apart with no currency
  (``5 m``: five metres or five million?) the number has two readings and is ambiguous.
  ``bps``/``bp``/``basis points`` are hundredths of a percent: ``50 bps`` is ``0.5%``.
- Kind: ``amount`` for a figure that can answer a question; ``year`` (1900–2100, bare four
  digits), ``period`` (``FY 2023``, ``Q3 2024``, a number glued to a letter such as
  ``3Q24``, ``FY23``, ``1st``), ``reference`` (``page 12``, ``p. 4``, ``Note 7``,
  ``Section 3``, ``Item 7``, ``Exhibit 99``, ``Table 2``, ``Step 2``, ``Form 10-K``),
  ``footnote`` (``[1]``, ``[^2]``, ``^3``; superscript digits are never numbers) and
  ``date`` (``March 31``, ``12/31/2023``) are labels, not answers.

`choose_answer` picks the number that answers: after an answer cue (boxed, ``<answer>``,
"answer:", "####") the first amount after the cue; with no cue the last amount of the text,
since models conclude at the end. Labels are skipped whenever an amount exists; a text whose
only numbers are labels (``It happened in 2019.``) answers with its last one. Two amounts
offered as alternatives (``12 or 15``, a range ``$1.2–1.5bn``) or a number with two readings
make the answer *ambiguous*: the criteria then report low confidence instead of full reward.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from fractions import Fraction

_CURRENCY = r"(?:US\$|A\$|C\$|HK\$|\$|€|£|¥|₹|USD|EUR|GBP|JPY|CHF|CAD|AUD|INR|CNY)"
_MINUS = "-\u2212\u2013"
_CURRENCY_CODE_BEFORE = "|".join(
    f"(?<={code})" for code in ("USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "INR", "CNY")
)
# A number starts after anything but a letter, digit or point (so not inside FY2023, v2 or
# 3.14), except right after a currency code (EUR1.2m).
_CORE = re.compile(
    rf"(?:{_CURRENCY_CODE_BEFORE}|(?<![A-Za-z0-9_.]))"
    r"(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"(?:[eE][-+]?\d+)?(?!\d)"
)
# The text before a number ends with: a minus (after a space or an opening mark, so never
# the dash of a range), a currency, an accounting parenthesis, a currency, a minus.
_LEFT = re.compile(
    rf"(?P<minus>(?<=[\s(:=*>\[{{~])[{_MINUS}]\s*)?(?P<cur>{_CURRENCY})?\s*"
    rf"(?P<open>\()?\s*(?P<cur2>{_CURRENCY})?\s*(?P<minus2>(?<=[\s(:=*>\[{{~$€£¥₹])[{_MINUS}])?"
    r"\s*$"
)
_STRONG_SCALES = {
    "thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12,
    "mn": 10**6, "bn": 10**9, "tn": 10**12,
}  # fmt: skip
_WEAK_SCALES = {"k": 10**3, "m": 10**6, "mm": 10**6, "b": 10**9, "t": 10**12}
_RIGHT = re.compile(
    r"(?P<pct_in>\s*%)?(?P<close_early>\s*\))?"
    r"(?P<space>\s*)(?P<scale>thousand|million|billion|trillion|mn|bn|tn|mm|MM|[kKmMbBtT])s?"
    r"(?![A-Za-z])"
    r"|(?P<pct_in2>\s*%)?(?P<close_only>\s*\))",
    re.IGNORECASE,
)
_AFTER = re.compile(
    r"\s*(?P<close>\))?\s*(?P<pct>%|percent(?:age\s+points?)?\b|per\s*cent\b|pct\b)?"
    r"(?P<bps>\s*(?:bps|bp|basis\s+points?)\b)?"
)
_GLUED_WORD = re.compile(r"[A-Za-z]")
_PERIOD_LEFT = re.compile(
    r"(?:\b(?:FY|CY|Q[1-4]|H[12]|[1-4]Q|[12]H|fiscal(?:\s+year)?|calendar\s+year)\s*'?$)", re.I
)
_REFERENCE_LEFT = re.compile(
    r"\b(?:p|pp|pg|page|pages|note|notes|section|sections|item|items|exhibit|table|figure|"
    r"fig|chart|appendix|footnote|form|schedule|part|chapter|slide|step|line|rule)\.?\s*"
    r"(?:no\.?\s*)?#?\s*$",
    re.I,
)
_MONTH_LEFT = re.compile(
    r"\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?\s*$", re.I
)
_HEDGE = re.compile(rf"^\s*[,(]?\s*(?:or(?:\s+maybe|\s+perhaps)?|[{_MINUS}—])\s*$", re.I)


_RANGE_DASH = re.compile(rf"\d\s*(?:%|[kKmMbB]n?)?\s*[{_MINUS}—]\s*{_CURRENCY}?\s*$")
_RANGE_BETWEEN = re.compile(rf"\bbetween\s+\S+\s+and\s+{_CURRENCY}?\s*$", re.I)
_HYPHEN_BEFORE = re.compile(r"[A-Za-z]-$")
_HYPHEN_AFTER = re.compile(r"-[A-Za-z]")
_SLASH_BEFORE = re.compile(r"\d/\s*$")
_SLASH_AFTER = re.compile(r"/\d")
_SUFFIX = re.compile(
    r"(?:thousand|million|billion|trillion|mn|bn|tn|mm|[kmbt]s?|x|bps|bp)(?![A-Za-z])", re.I
)
_FILLER = re.compile(rf"{_CURRENCY}|[{_MINUS}()$*~≈:=.,\s]|\\[$%]|approx(?:imately)?\.?")
_FILLER_WORDS = re.compile(r"(?i)\b(?:about|around|roughly|dollars?|euros?|pounds?|usd|eur|gbp)\b")


@dataclass(frozen=True)
class Amount:
    value: Fraction
    percent: bool
    kind: str  # amount, year, period, reference, footnote, date
    start: int
    end: int
    text: str
    # A second way to read it (``5 m``: 5 or 5,000,000), or None.
    other_reading: Fraction | None = None
    scale: int = 1
    # Written right after another number with a dash: the upper end of a range.
    range_end: bool = False

    @property
    def is_label(self) -> bool:
        return self.kind != "amount"


@functools.lru_cache(maxsize=8192)
def read_amounts(text: str, short_scales: str = "auto") -> tuple[Amount, ...]:
    """Every number in ``text`` as an `Amount`, in order. ``short_scales``: ``auto`` (the
    rules above), ``always`` (``5 m`` is five million: a document of figures) or ``never``
    (``5 m``, ``5m`` are five metres: a text of measures)."""
    found: list[Amount] = []
    for match in _CORE.finditer(text):
        amount = _read_one(text, match, short_scales)
        if amount is not None:
            found.append(amount)
    return tuple(found)


def _read_one(text: str, match: re.Match[str], short_scales: str) -> Amount | None:
    start, end = match.span()
    core = match.group(0)
    digits = core.replace(",", "")
    try:
        value = Fraction(int(digits)) if digits.isdigit() else Fraction(digits)
    except (ValueError, ZeroDivisionError):
        return None
    head = text[max(0, start - 24) : start]
    left_text = (" " if start <= 24 else "a") + head
    left = _LEFT.search(left_text)
    negative = bool(left and (left.group("minus") or left.group("minus2")))
    currency = bool(left and (left.group("cur") or left.group("cur2")))
    opened = bool(left and left.group("open"))
    tail = text[end : end + 40]
    percent = False
    closed = False
    scale = 1
    other: Fraction | None = None
    position = 0
    right = _RIGHT.match(tail)
    if right and right.group("scale"):
        word = right.group("scale")
        factor = _STRONG_SCALES.get(word.lower()) or _WEAK_SCALES.get(word.lower(), 1)
        percent = bool(right.group("pct_in"))
        closed = bool(right.group("close_early"))
        strong = word.lower() in _STRONG_SCALES or word == "MM"
        if (
            strong
            or short_scales == "always"
            or (short_scales == "auto" and (not right.group("space") or currency))
        ):
            scale = factor
            position = right.end()
        elif short_scales == "auto":
            other = value * factor  # "5 m": metres or million
            position = right.end()
    elif right and right.group("close_only"):
        percent = bool(right.group("pct_in2"))
        closed = True
        position = right.end()
    after = _AFTER.match(tail, position)
    if after:
        closed = closed or bool(after.group("close"))
        if after.group("pct"):
            percent = True
        if after.group("bps"):
            value, percent = value / 100, True
            other = None
        position = max(position, after.end())
    if opened and closed:
        negative = True
    kind = _kind(text, start, end, head, tail, value, core, currency, percent, scale)
    range_end = bool(_RANGE_DASH.search(head) or _RANGE_BETWEEN.search(head))
    if range_end:
        negative = False
    signed = -value * scale if negative else value * scale
    if other is not None and negative:
        other = -other
    return Amount(
        value=signed,
        percent=percent,
        kind=kind,
        start=start,
        end=end + position,
        text=text[start : end + position].strip(),
        other_reading=other,
        range_end=range_end,
        scale=scale,
    )


def _kind(
    text: str,
    start: int,
    end: int,
    head: str,
    tail: str,
    value: Fraction,
    core: str,
    currency: bool,
    percent: bool,
    scale: int,
) -> str:
    if head.rstrip().endswith(("[", "[^", "^")) and (
        tail.lstrip().startswith("]") or head.endswith("^")
    ):
        return "footnote"
    if _REFERENCE_LEFT.search(head):
        return "reference"
    if _HYPHEN_BEFORE.search(head) or _HYPHEN_AFTER.match(tail):
        return "period"  # hyphenated labels: COVID-19, 10-K
    if tail[:1] and _GLUED_WORD.match(tail[:1]) and not _SUFFIX.match(tail):
        return "period"  # glued to a word: 3Q24, 1st, 5th
    if _SLASH_BEFORE.search(head) or _SLASH_AFTER.match(tail):
        return "date"
    if _MONTH_LEFT.search(head):
        return "date"
    plain = not currency and not percent and scale == 1
    if _PERIOD_LEFT.search(head) and plain:
        return "period"
    if plain and len(core) == 4 and core.isdigit() and 1900 <= value <= 2100:
        return "year"
    if head.endswith("'") and len(core) == 2 and core.isdigit():
        return "year"
    return "amount"


@functools.lru_cache(maxsize=8192)
def read_single_amount(text: str, short_scales: str = "auto") -> Amount | None:
    """The amount ``text`` states when it states exactly one and nothing else of substance
    (a table cell, a boxed answer): ``(1,234)``, ``$2.5bn``, ``12.5%``."""
    amounts = read_amounts(text, short_scales)
    if len(amounts) != 1:
        return None
    amount = amounts[0]
    rest = (text[: amount.start] + " " + text[amount.end :]).strip()
    rest = _FILLER.sub("", _FILLER_WORDS.sub("", rest))
    return amount if not rest.strip() else None


@dataclass(frozen=True)
class Choice:
    amount: Amount | None
    ambiguous: str | None = None  # why the answer cannot be read with confidence
    skipped: tuple[str, ...] = ()


def choose_answer(text: str, cued: bool, short_scales: str = "auto") -> Choice:
    """The amount that answers, by the rules in the module docstring."""
    amounts = read_amounts(text, short_scales)
    if not amounts:
        return Choice(None)
    substantive = [a for a in amounts if not a.is_label]
    skipped = tuple(f"{a.text} ({a.kind})" for a in amounts if a.is_label)
    if not substantive:
        pool = list(amounts)
        chosen = pool[0] if cued else pool[-1]
        return Choice(chosen, _two_readings(chosen), skipped if len(pool) > 1 else ())
    if cued:
        chosen = substantive[0]
        following = substantive[1] if len(substantive) > 1 else None
        why = _two_readings(chosen)
        if following is not None and (following.range_end or _is_hedge(text, chosen, following)):
            why = why or f"alternatives: {chosen.text} / {following.text}"
        return Choice(chosen, why, skipped)
    chosen = substantive[-1]
    previous = substantive[-2] if len(substantive) > 1 else None
    why = _two_readings(chosen)
    if previous is not None and (chosen.range_end or _is_hedge(text, previous, chosen)):
        why = why or f"alternatives: {previous.text} / {chosen.text}"
    return Choice(chosen, why, skipped)


def _two_readings(amount: Amount) -> str | None:
    if amount.other_reading is None:
        return None
    return f"{amount.text!r} reads as {float(amount.value):g} or {float(amount.other_reading):g}"


def _is_hedge(text: str, first: Amount, second: Amount) -> bool:
    return bool(_HEDGE.match(text[first.end : second.start]))
