"""Reading a plain number the way people write it: ``1,234.5``, ``$12``, ``45%``, ``3/4``,
``\\frac{3}{4}``, ``−2``, ``1.2e3``, ``12 cm``. Anything more (an expression, a set, a matrix)
is not a plain number and is left to SymPy through math-verify.

The result is exact (`fractions.Fraction`) plus whether a percent sign was present, so callers
decide whether "45%" means 45 or 0.45.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from fractions import Fraction

_LATEX_NOISE = re.compile(r"\\[,!;:> ]|\\(?:left|right|displaystyle|mathrm|textbf|mathbf)\b|~")
_TEXT_WRAPPER = re.compile(r"\\(?:text|mbox|textrm|operatorname)\s*\{([^{}]*)\}")
_FRAC = re.compile(
    r"^\\[dt]?frac\s*\{\s*([^{}]+?)\s*\}\s*\{\s*([^{}]+?)\s*\}$|^\\[dt]?frac(\d)(\d)$"
)
_CURRENCY = re.compile(r"^(?:\\?\$|US\$|€|£|¥|₹|USD|EUR|GBP)\s*")
_CURRENCY_WORDS = re.compile(r"\s*(?:dollars?|euros?|pounds?|cents?|usd|eur|gbp)\.?$", re.I)
_PERCENT = re.compile(r"\s*(?:\\?%|percent|per\s*cent|pct)\.?$", re.I)
_UNIT = re.compile(r"\s*(?:[a-zA-Zµ°][a-zA-Zµ°²³/^0-9.]*(?:\s+[a-zA-Z]+)?)$")
_PLAIN = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$")
_GROUPED = re.compile(
    r"^[-+]?\d{1,3}(?:(?P<sep>[,\u202f\u2009 '])\d{3})(?:(?P=sep)\d{3})*(?:\.\d+)?$"
)
_RATIO = re.compile(r"^([-+]?\d+)\s*/\s*(\d+)$")
_SCI_LATEX = re.compile(
    r"^([-+]?\d+(?:\.\d+)?)\s*(?:\\times|\\cdot|x|×|\*)\s*10\s*\^\s*\{?\s*([-+]?\d+)\s*\}?$"
)
_SCALE_WORD = re.compile(r"\s+(thousand|million|billion|trillion)s?$", re.I)
_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
_MINUS = str.maketrans({"\u2212": "-", "\u2013": "-", "\u00a0": " "})


@dataclass(frozen=True)
class ParsedNumber:
    value: Fraction
    percent: bool = False
    key: tuple[int, int] = field(init=False, repr=False, compare=False)
    approx: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Precomputed once (parses are cached): comparing integers and floats is several
        # times faster than comparing Fractions, and comparison is the hot path.
        object.__setattr__(self, "key", (self.value.numerator, self.value.denominator))
        object.__setattr__(self, "approx", float(self.value))


@functools.lru_cache(maxsize=65536)
def parse_number(text: str, allow_units: bool = True) -> ParsedNumber | None:
    """The number ``text`` states, or None when it is not a plain number."""
    if len(text) > 200:
        return None
    s = text.translate(_MINUS).strip().strip("$").strip()
    s = _TEXT_WRAPPER.sub(r" \1", s)
    s = _LATEX_NOISE.sub("", s).strip()
    s = s.rstrip(".").strip()
    if s.startswith("{") and s.endswith("}"):
        s = s[1:-1].strip()
    negative = False
    if s.startswith("-") and len(s) > 1 and not s[1].isdigit() and s[1] != ".":
        negative, s = True, s[1:].strip()
    s = _CURRENCY.sub("", s)
    s = _CURRENCY_WORDS.sub("", s)
    scale = 1
    word = _SCALE_WORD.search(s)
    if word:
        scale, s = _SCALES[word.group(1).lower()], s[: word.start()].strip()
    percent = False
    if _PERCENT.search(s):
        percent, s = True, _PERCENT.sub("", s)
    if allow_units and s and not s[-1].isdigit() and not s.endswith("}"):
        stripped = _UNIT.sub("", s)
        if stripped and stripped != s and (stripped[-1].isdigit() or stripped.endswith("}")):
            s = stripped.strip()
            if _PERCENT.search(s):
                percent, s = True, _PERCENT.sub("", s)
    s = s.strip()
    value = _to_fraction(s)
    if value is None:
        return None
    value *= scale
    return ParsedNumber(-value if negative else value, percent)


def _to_fraction(s: str) -> Fraction | None:
    if _PLAIN.match(s):
        return Fraction(s)
    if _GROUPED.match(s):
        return Fraction(re.sub(r"[,\u202f\u2009 ']", "", s))
    sign = 1
    if s.startswith("-"):
        sign, s = -1, s[1:].strip()
    frac = _FRAC.match(s)
    if frac:
        numerator = _to_fraction(frac.group(1) or frac.group(3))
        denominator = _to_fraction(frac.group(2) or frac.group(4))
        if numerator is None or not denominator:
            return None
        return sign * numerator / denominator
    ratio = _RATIO.match(s)
    if ratio and int(ratio.group(2)) != 0:
        return sign * Fraction(int(ratio.group(1)), int(ratio.group(2)))
    sci = _SCI_LATEX.match(s)
    if sci and abs(int(sci.group(2))) <= 400:
        return sign * Fraction(sci.group(1)) * Fraction(10) ** int(sci.group(2))
    return None


def equal_numbers(a: ParsedNumber, b: ParsedNumber, rel_tol: float, abs_tol: float) -> bool:
    """Whether two plain numbers agree; a percentage on one side may mean x or x/100."""
    if a.key == b.key:
        return True
    if _within(a.approx, b.approx, rel_tol, abs_tol):
        return True
    if a.percent != b.percent:
        scaled, other = (a, b) if a.percent else (b, a)
        return close(scaled.value / 100, other.value, rel_tol, abs_tol)
    return False


def _within(x: float, y: float, rel_tol: float, abs_tol: float) -> bool:
    if not rel_tol and not abs_tol:
        return False
    difference = abs(x - y)
    return difference <= abs_tol or difference <= rel_tol * max(abs(x), abs(y))


def close(x: Fraction, y: Fraction, rel_tol: float, abs_tol: float) -> bool:
    if x == y:
        return True
    # Unequal: tolerances are floats anyway, and float arithmetic is ten times faster here.
    return _within(float(x), float(y), rel_tol, abs_tol)
