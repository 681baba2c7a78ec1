"""Structure criteria: JSON that validates against a schema; required format tags."""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, ValidationError

from rewards.extract import REGEX_TIMEOUT_S, compiled, extract_answer
from rewards.registry import Criterion, ParamProblem, register
from rewards.types import CriterionError, Outcome, Sample


def _pattern_with_timeout(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    # jsonschema's own "pattern" uses `re`, which holds the GIL for as long as a
    # catastrophic pattern backtracks over model output; `regex` gives up after a timeout.
    if not validator.is_type(instance, "string"):
        return
    try:
        matched = compiled(pattern).search(instance, timeout=REGEX_TIMEOUT_S)
    except TimeoutError as exc:
        raise CriterionError(f"schema pattern {pattern!r} timed out") from exc
    if matched is None:
        yield ValidationError(f"{instance[:100]!r} does not match {pattern!r}")


_Validator = validators.extend(Draft202012Validator, {"pattern": _pattern_with_timeout})

_FENCE = re.compile(r"```(?:json|JSON)?[ \t]*\n(.*?)\n?```", re.DOTALL)
MAX_JSON_CHARS = 1_000_000


def _json_candidates(text: str, where: str) -> list[str]:
    if where == "full":
        return [text.strip()]
    if where == "answer_tag":
        tagged = extract_answer(text, "answer_tag")
        return [tagged] if tagged is not None else []
    candidates = [block.strip() for block in reversed(_FENCE.findall(text))]
    candidates.append(text.strip())
    # The outermost {...} or [...] span, for JSON wrapped in prose.
    for opener, closer in (("{", "}"), ("[", "]")):
        start, end = text.find(opener), text.rfind(closer)
        if 0 <= start < end:
            candidates.append(text[start : end + 1])
    return candidates


@register
class JsonSchema(Criterion):
    """Scores 1 when the response holds JSON that validates against ``schema``, else 0.

    ``where`` says where the JSON is: ``auto`` (default: the last fenced code block, else the
    whole response, else the outermost braces), ``full`` (the whole response must be JSON),
    ``answer_tag``. Validation uses `jsonschema` (draft 2020-12); ``details.errors`` lists up
    to 10 problems with their JSON paths. JSON that parses but does not validate scores
    ``parse_only_score`` (default 0).
    """

    kind = "json_schema"
    summary = "The response holds JSON valid against a JSON schema (jsonschema)."
    # A schema's "pattern" keywords run regexes over model output: keep a deadline on it.
    blocking = True
    default_timeout_s = 5.0
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "required": ["schema"],
        "properties": {
            "schema": {"type": ["object", "boolean"]},
            "where": {"type": "string", "enum": ["auto", "full", "answer_tag"]},
            "parse_only_score": {"type": "number", "minimum": 0, "maximum": 1},
        },
    }

    @classmethod
    def check_params(cls, params: dict[str, Any]) -> list[ParamProblem]:
        try:
            Draft202012Validator.check_schema(params["schema"])
        except SchemaError as exc:
            where = ".".join(str(p) for p in exc.path)
            return [
                (
                    f"schema.{where}" if where else "schema",
                    f"is not a valid JSON schema: {exc.message}",
                )
            ]
        return []

    def __init__(self, params: dict[str, Any], context: Any) -> None:
        super().__init__(params, context)
        self._validator = _Validator(params["schema"])

    def evaluate(self, sample: Sample) -> Outcome:
        text = sample.response
        if len(text) > MAX_JSON_CHARS:
            return Outcome(0.0, {"reason": f"response longer than {MAX_JSON_CHARS} characters"})
        document: Any = None
        parsed = False
        for candidate in _json_candidates(text, self.params.get("where", "auto")):
            try:
                document = json.loads(candidate)
            except (ValueError, RecursionError):
                continue
            parsed = True
            break
        if not parsed:
            return Outcome(0.0, {"reason": "no parseable JSON found"})
        errors = []
        for error in self._validator.iter_errors(document):
            errors.append({"path": error.json_path, "message": error.message[:300]})
            if len(errors) >= 10:
                break
        if errors:
            return Outcome(float(self.params.get("parse_only_score", 0.0)), {"errors": errors})
        return Outcome(1.0, {"valid": True})


@register
class FormatTags(Criterion):
    """Scores 1 when the response holds the required tagged blocks, in order, each once.

    ``tags`` names them in order, e.g. ``["think", "answer"]`` for
    ``<think>…</think><answer>…</answer>``. With ``strict`` (default true) nothing but
    whitespace may stand outside the blocks; blocks must not be empty unless
    ``allow_empty``. With ``"credit": "fraction"`` the score is the fraction of tags present
    and well-formed (order still required for full marks).
    """

    kind = "format_tags"
    summary = "Required tagged blocks (e.g. <think> then <answer>) appear in order."
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "required": ["tags"],
        "properties": {
            "tags": {
                "type": "array",
                "minItems": 1,
                "uniqueItems": True,
                "items": {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9_\\-]*$"},
            },
            "strict": {"type": "boolean"},
            "allow_empty": {"type": "boolean"},
            "credit": {"type": "string", "enum": ["binary", "fraction"]},
        },
    }

    def evaluate(self, sample: Sample) -> Outcome:
        text = sample.response
        tags: list[str] = self.params["tags"]
        allow_empty = self.params.get("allow_empty", False)
        problems: list[str] = []
        spans: list[tuple[int, int]] = []
        well_formed = 0
        for tag in tags:
            opens = [m.start() for m in re.finditer(rf"<{re.escape(tag)}>", text)]
            closes = [m.end() for m in re.finditer(rf"</{re.escape(tag)}>", text)]
            if len(opens) != 1 or len(closes) != 1:
                problems.append(f"<{tag}> appears {len(opens)} time(s), </{tag}> {len(closes)}")
                continue
            start, end = opens[0], closes[0]
            if end <= start:
                problems.append(f"</{tag}> comes before <{tag}>")
                continue
            inner = text[start + len(tag) + 2 : end - len(tag) - 3]
            if not inner.strip() and not allow_empty:
                problems.append(f"<{tag}> is empty")
                continue
            well_formed += 1
            spans.append((start, end))
        if not problems:
            if any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False)):
                problems.append(f"blocks are not in the order {', '.join(tags)} (or overlap)")
            elif self.params.get("strict", True):
                outside = (
                    text[: spans[0][0]]
                    + "".join(text[a[1] : b[0]] for a, b in zip(spans, spans[1:], strict=False))
                    + text[spans[-1][1] :]
                )
                if outside.strip():
                    problems.append("text outside the tagged blocks")
        if not problems:
            return Outcome(1.0, {"ok": True})
        if self.params.get("credit") == "fraction":
            return Outcome(0.99 * well_formed / len(tags), {"problems": problems})
        return Outcome(0.0, {"problems": problems})
