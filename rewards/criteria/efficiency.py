"""Efficiency criteria: a length penalty past a token budget; a bonus for short correct answers."""

from __future__ import annotations

import functools
import re
from typing import Any, ClassVar

from rewards.registry import Criterion, ParamProblem, register
from rewards.sandboxing import ScoringState
from rewards.types import CriterionError, Outcome, Sample

_APPROXIMATE_TOKEN = re.compile(r"\w+|[^\w\s]")
TOKEN_COUNT_KEYS = ("response_tokens", "completion_tokens", "num_tokens")

TOKENS_PROPERTIES: dict[str, Any] = {
    "tokenizer": {
        "type": "string",
        "minLength": 1,
        "description": "a local tokenizer directory (transformers); otherwise the sample's "
        "metadata.response_tokens, else an approximate count of words and punctuation",
    }
}


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def response_tokens(sample: Sample, tokenizer: str | None) -> tuple[int, str]:
    """The response's length in tokens and how it was counted."""
    for key in TOKEN_COUNT_KEYS:
        value = sample.metadata.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value, f"metadata.{key}"
    ids = sample.metadata.get("response_token_ids")
    if isinstance(ids, list):
        return len(ids), "metadata.response_token_ids"
    if tokenizer:
        try:
            return len(_tokenizer(tokenizer)(sample.response)["input_ids"]), "tokenizer"
        except OSError as exc:
            raise CriterionError(f"cannot load tokenizer {tokenizer!r}: {exc}") from exc
    return len(_APPROXIMATE_TOKEN.findall(sample.response)), "approximate"


@register
class LengthPenalty(Criterion):
    """Scores 1 up to ``budget_tokens``, falling linearly to 0 at ``zero_at_tokens``.

    ``zero_at_tokens`` defaults to twice the budget. Give it a negative weight-free role by
    combining with correctness in a ``weighted_sum`` or ``product``. Tokens come from the
    sample's ``metadata.response_tokens`` (what the rollout engine counted), a local
    ``tokenizer``, or an approximate count.
    """

    kind = "length_penalty"
    summary = "Full score within a token budget, falling to 0 past it."
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "required": ["budget_tokens"],
        "properties": {
            "budget_tokens": {"type": "integer", "minimum": 1},
            "zero_at_tokens": {"type": "integer", "minimum": 2},
            **TOKENS_PROPERTIES,
        },
    }

    @classmethod
    def check_params(cls, params: dict[str, Any]) -> list[ParamProblem]:
        zero_at = params.get("zero_at_tokens")
        if zero_at is not None and zero_at <= params["budget_tokens"]:
            return [("zero_at_tokens", "must be above budget_tokens")]
        return []

    def evaluate(self, sample: Sample) -> Outcome:
        budget = int(self.params["budget_tokens"])
        zero_at = int(self.params.get("zero_at_tokens", 2 * budget))
        tokens, counted_by = response_tokens(sample, self.params.get("tokenizer"))
        score = 1.0 if tokens <= budget else max(0.0, (zero_at - tokens) / (zero_at - budget))
        return Outcome(score, {"tokens": tokens, "counted_by": counted_by, "budget": budget})


@register
class BrevityBonus(Criterion):
    """A bonus for short answers — only when an earlier criterion passed (a correct answer).

    Scores 1 at or below ``target_tokens``, falling linearly to 0 at ``max_tokens``.
    ``if_passed`` names an earlier criterion in the rubric (say the correctness check); when
    it scored below ``pass_threshold`` (default 1) the bonus is 0, so a short wrong answer
    earns nothing. This is how training favours short reasoning (a model's fast variant).
    """

    kind = "brevity_bonus"
    summary = "Bonus for shorter answers, paid only when a named earlier criterion passed."
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "required": ["max_tokens"],
        "properties": {
            "target_tokens": {"type": "integer", "minimum": 0},
            "max_tokens": {"type": "integer", "minimum": 1},
            "if_passed": {"type": "string", "minLength": 1},
            "pass_threshold": {"type": "number"},
            **TOKENS_PROPERTIES,
        },
    }

    @classmethod
    def check_params(cls, params: dict[str, Any]) -> list[ParamProblem]:
        if params.get("target_tokens", 0) >= params["max_tokens"]:
            return [("target_tokens", "must be below max_tokens")]
        return []

    @classmethod
    def references(cls, params: dict[str, Any]) -> list[tuple[str, str]]:
        name = params.get("if_passed")
        return [("if_passed", name)] if isinstance(name, str) else []

    def judge(self, sample: Sample, state: ScoringState) -> Outcome:
        return self._score(sample, state.earlier)

    def _score(self, sample: Sample, earlier: dict[str, float]) -> Outcome:
        gate = self.params.get("if_passed")
        if gate is not None:
            threshold = float(self.params.get("pass_threshold", 1.0))
            if earlier.get(gate, 0.0) < threshold - 1e-9:
                return Outcome(0.0, {"reason": f"{gate!r} did not pass"})
        target = int(self.params.get("target_tokens", 0))
        maximum = int(self.params["max_tokens"])
        tokens, counted_by = response_tokens(sample, self.params.get("tokenizer"))
        score = 1.0 if tokens <= target else max(0.0, (maximum - tokens) / (maximum - target))
        return Outcome(score, {"tokens": tokens, "counted_by": counted_by})

    def evaluate(self, sample: Sample) -> Outcome:
        return self._score(sample, {})
