"""Demo domains: small task families a model of a few million parameters can learn.

Each domain generates tasks deterministically from a seed, splits them into disjoint ``train``
and ``held_out`` sets by a hash of the task's identity, carries a rubric spec for the
rewards library, and writes reference completions for the supervised warm-up of the demo model.

- ``arithmetic`` — two-digit addition and subtraction, answer in ``\\boxed{}`` (math criterion).
- ``json_format`` — a basket of fruit reported as a JSON object (the two counts) under the
  field names the question asks for, one of two namings (JSON-schema criterion for the
  structure, ``labelled_values`` for each field asked for: partial credit). Its warm-up
  demonstrations have the right values under a naming drawn at random, as if the annotator
  ignored the requested names: the base writes either naming, and following the request is
  for the rubric to teach.
- ``code`` — a one-line Python function described in words (``x times 7``), checked by unit
  tests that run in a sandbox (``ground_truth`` is the list of asserts; the score is the
  fraction passed). Its warm-up demonstrations have the constant asked for and an operator
  drawn at random, as if the annotator mixed up the words: the base writes well-formed
  functions with any of the three operators, and reading the word is for the rubric to teach.
- ``parity`` — whether a number is even or odd, answer in ``\\boxed{}``. Its warm-up
  demonstrations show the answer format only: their labels are coin flips, as if written by an
  annotator who guessed, so the base model answers at chance and the rubric is the only teacher
  of the skill (what the proof that RL learns, ``tests/training/test_learning.py``, and the
  forgetting benchmark, ``bench/bench_forgetting.py``, rely on).
- ``tool_calc`` — multi-turn tool use: a product of two-digit numbers (too hard for the tiny
  model to do in its head) computed by calling the ``python`` tool, then the answer in
  ``\\boxed{}``. Only returned by ``demo_domains(include_tool_use=True)`` because its episodes
  need ``training.agent``.

A task is ``{"prompt": str, "ground_truth": ..., "metadata": {...}}``; the prompt is already in
the demo chat format (``training.demo.chat``), and ``metadata["question"]`` holds the plain
question for OpenAI-style messages.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from training.demo.chat import END, render_turn, user_prompt
from training.tasks import HELD_OUT, SPLITS, TRAIN

# One task identity in this many is held out for evaluation.
_HELD_OUT_ONE_IN = 5
# The split's word in the seed of each draw. The held-out split was called "test" when the demo
# model was built and the learning runs measured; the seed keeps that word so that every draw
# (and so every measured result) stays the same. It is not a split name: SPLITS is.
_DRAW_SEED_WORD = {TRAIN: "train", HELD_OUT: "test"}


def _split_of(domain: str, key: str) -> str:
    digest = hashlib.sha256(f"{domain}:{key}".encode()).digest()
    return HELD_OUT if digest[0] % _HELD_OUT_ONE_IN == 0 else TRAIN


@dataclass(frozen=True)
class _Draft:
    """A task before it is placed in a split: identity, question, answer and reference."""

    key: str
    question: str
    ground_truth: Any
    reference: str  # the assistant's part of the reference completion, before END
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DemoDomain:
    """One demo task family. ``make_tasks`` is deterministic in ``(n, seed, split)``."""

    name: str
    description: str
    rubric_spec: dict[str, Any]
    draw: Callable[[random.Random], _Draft] = field(repr=False)
    tools: tuple[str, ...] = ()
    max_new_tokens: int = 48
    # Writes the warm-up's demonstration of a draft when it is not the correct reference (a
    # guesser's answer: flawed SFT data, as real warm-up sets have).
    demonstrate: Callable[[random.Random, _Draft], str] | None = field(default=None, repr=False)
    # This domain's share of the warm-up relative to a full domain's (a fifth of the examples).
    warmup_weight: float = 1.0
    # The metadata key holding what a policy that ignores the question would answer the same
    # everywhere (json_format's naming), for held-out sets balanced over it; None: the
    # ground truth itself, where it is one of a few labels (parity).
    balance_by: str | None = None

    def make_tasks(self, n: int, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
        """``n`` tasks of ``split`` ("train" or "held_out"); the two splits never share a task."""
        return [self._task(draft) for draft in self._drafts(n, seed, split)]

    def reference_completions(self, n: int, seed: int = 0) -> list[tuple[str, str]]:
        """``(prompt, correct completion)`` pairs from the train split."""
        return [
            (self._task(draft)["prompt"], draft.reference + END)
            for draft in self._drafts(n, seed, "train")
        ]

    def sft_examples(self, n: int, seed: int = 0) -> list[tuple[str, str]]:
        """``(prompt, completion)`` pairs from the train split for the supervised warm-up.

        The completion is the correct reference unless the domain has a ``demonstrate``
        function, whose (possibly wrong) demonstration is used instead.
        """
        if self.demonstrate is None:
            return self.reference_completions(n, seed)
        guesses = random.Random(f"{self.name}:demonstrations:{seed}")
        return [
            (self._task(draft)["prompt"], self.demonstrate(guesses, draft) + END)
            for draft in self._drafts(n, seed, "train")
        ]

    def _drafts(self, n: int, seed: int, split: str) -> list[_Draft]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if n < 0:
            raise ValueError(f"n must be ≥ 0, got {n}")
        rng = random.Random(f"{self.name}:{_DRAW_SEED_WORD[split]}:{seed}")
        drafts: list[_Draft] = []
        attempts = 0
        while len(drafts) < n:
            attempts += 1
            if attempts > 200 * (n + 10):
                raise RuntimeError(f"domain {self.name!r} cannot draw {n} {split} tasks")
            draft = self.draw(rng)
            if _split_of(self.name, draft.key) == split:
                drafts.append(draft)
        return drafts

    def _task(self, draft: _Draft) -> dict[str, Any]:
        metadata = {
            "domain": self.name,
            "question": draft.question,
            "task_id": f"{self.name}:{draft.key}",
            "tools": list(self.tools),
            "max_new_tokens": self.max_new_tokens,
            **draft.extra,
        }
        return {
            "prompt": user_prompt(draft.question),
            "ground_truth": draft.ground_truth,
            "metadata": metadata,
        }


# --- arithmetic -------------------------------------------------------------------------------


def _draw_arithmetic(rng: random.Random) -> _Draft:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    if rng.random() < 0.5:
        op, value = "+", a + b
    else:
        a, b = max(a, b), min(a, b)
        op, value = "-", a - b
    return _Draft(
        key=f"{a}{op}{b}",
        question=f"What is {a} {op} {b}?",
        ground_truth=str(value),
        reference=f"\\boxed{{{value}}}",
    )


ARITHMETIC_RUBRIC: dict[str, Any] = {
    "version": 1,
    "criteria": [
        {
            "name": "correct",
            "kind": "math_equivalence",
            "weight": 1.0,
            "params": {"extract": "boxed"},
        }
    ],
    "aggregate": "weighted_sum",
}


# --- json_format ------------------------------------------------------------------------------

_FRUITS = ("apples", "pears", "plums", "figs", "limes", "kiwis", "dates", "grapes")

# The field names the question asks for: one of two namings, drawn per task. Following the
# requested names (a schema that comes with the request) is the skill RL teaches here: the
# warm-up's annotator ignored them (`_guess_basket_names`).
# No field needs arithmetic: a total (recipes up to 6) was right about 2 % of the time before and
# after RL, so its third of the fields' credit was out of reach and left too little to learn for
# a rise to clear the learning test's bar on every machine (bench/README.md, "Learning").
BASKET_NAMINGS: tuple[tuple[str, str], ...] = (
    ("first", "second"),
    ("left", "right"),
)


def _basket_schema(names: tuple[str, str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": "integer"} for name in names},
        "required": list(names),
        "additionalProperties": False,
    }


# Well-formed under either naming; whether it is the naming asked for is the fields' criterion.
BASKET_SCHEMA: dict[str, Any] = {"oneOf": [_basket_schema(names) for names in BASKET_NAMINGS]}


def _draw_json(rng: random.Random) -> _Draft:
    first_fruit, second_fruit = rng.sample(_FRUITS, 2)
    first, second = rng.randint(1, 49), rng.randint(1, 49)
    names = rng.choice(BASKET_NAMINGS)
    fields = dict(zip(names, (first, second), strict=True))
    return _Draft(
        key=f"{first_fruit}{first}{second_fruit}{second}:{names[0]}",
        question=(
            f"A basket holds {first} {first_fruit} and {second} {second_fruit}. "
            f"Reply with JSON giving {names[0]} and {names[1]}."
        ),
        # A mapping of field name to value: the rubric's `labelled_values` criterion reads it.
        ground_truth=fields,
        reference=json.dumps(fields),
        extra={"naming": names[0]},
    )


def _guess_basket_names(rng: random.Random, draft: _Draft) -> str:
    """The right values under a naming drawn at random, whatever the question asked for."""
    names = rng.choice(BASKET_NAMINGS)
    return json.dumps(dict(zip(names, draft.ground_truth.values(), strict=True)))


JSON_RUBRIC: dict[str, Any] = {
    "version": 1,
    "criteria": [
        {
            "name": "valid_json",
            "kind": "json_schema",
            "weight": 0.1,
            "params": {"schema": BASKET_SCHEMA},
        },
        # Partial credit per field asked for (value exact): a reply under the wrong naming
        # states none of them; under the right one it gets each count it copies right.
        {
            "name": "fields",
            "kind": "labelled_values",
            "weight": 0.9,
            "params": {"rel_tol": 0.0, "abs_tol": 0.0},
        },
    ],
    "aggregate": "weighted_sum",
}


# --- code -------------------------------------------------------------------------------------

_OPS = {"plus": "+", "minus": "-", "times": "*"}


def _code_draft(word: str, constant: int) -> tuple[str, list[str]]:
    """The expression a one-operator description means, and its unit tests."""
    expression = f"x {_OPS[word]} {constant}"
    inputs = (0, 1, 2, 5, -3)
    # One assert per test, as the rewards library's unit_tests criterion takes them (MBPP style).
    tests = [f"assert f({x}) == {eval(expression, {'x': x})}" for x in inputs]  # noqa: S307
    return expression, tests


def _draw_code(rng: random.Random) -> _Draft:
    word, constant = rng.choice(list(_OPS)), rng.randint(1, 99)
    expression, tests = _code_draft(word, constant)
    return _Draft(
        key=expression,
        question=f"Write a Python function f(x) that returns x {word} {constant}.",
        ground_truth=tests,
        reference=f"```python\ndef f(x):\n    return {expression}\n```",
        extra={"entry_point": "f", "operator": word},
    )


def _guess_code_operator(rng: random.Random, draft: _Draft) -> str:
    """The function with the constant asked for and an operator drawn at random, whatever the
    question's word: an annotator who mixed up the words."""
    word = rng.choice(list(_OPS))
    constant = int(draft.key.rsplit(" ", 1)[1])
    expression, _ = _code_draft(word, constant)
    return f"```python\ndef f(x):\n    return {expression}\n```"


CODE_RUBRIC: dict[str, Any] = {
    "version": 1,
    "criteria": [{"name": "tests", "kind": "unit_tests", "weight": 1.0, "params": {}}],
    "aggregate": "weighted_sum",
}


# --- parity -----------------------------------------------------------------------------------


def _draw_parity(rng: random.Random) -> _Draft:
    number = rng.randint(0, 9999)
    answer = "even" if number % 2 == 0 else "odd"
    return _Draft(
        key=str(number),
        question=f"Is {number} even or odd?",
        ground_truth=answer,
        reference=f"\\boxed{{{answer}}}",
    )


def _guess_parity(rng: random.Random, draft: _Draft) -> str:
    return f"\\boxed{{{rng.choice(('even', 'odd'))}}}"


PARITY_RUBRIC: dict[str, Any] = {
    "version": 1,
    "criteria": [
        {"name": "correct", "kind": "exact_match", "weight": 1.0, "params": {"extract": "boxed"}}
    ],
    "aggregate": "weighted_sum",
}


# --- tool_calc (multi-turn tool use) ----------------------------------------------------------


def _draw_tool_calc(rng: random.Random) -> _Draft:
    a, b = rng.randint(11, 99), rng.randint(11, 99)
    value = a * b
    reference = (
        f"<tool>python\nprint({a} * {b})\n</tool>{END}\n"
        + render_turn("tool", str(value))
        + f"<|assistant|>\n\\boxed{{{value}}}"
    )
    return _Draft(
        key=f"{a}*{b}",
        question=f"Use the python tool to compute {a} * {b}.",
        ground_truth=str(value),
        reference=reference,
        extra={"max_turns": 3},
    )


TOOL_CALC_RUBRIC: dict[str, Any] = ARITHMETIC_RUBRIC


def demo_domains(include_tool_use: bool = False) -> list[DemoDomain]:
    """The demo domains; ``include_tool_use`` adds ``tool_calc`` (multi-turn, needs the agent)."""
    domains = [
        DemoDomain(
            name="arithmetic",
            description="Two-digit addition and subtraction; answer in \\boxed{}.",
            rubric_spec=ARITHMETIC_RUBRIC,
            draw=_draw_arithmetic,
            max_new_tokens=16,
        ),
        DemoDomain(
            name="json_format",
            description="Report a basket as JSON under the field names asked for.",
            rubric_spec=JSON_RUBRIC,
            draw=_draw_json,
            max_new_tokens=40,
            demonstrate=_guess_basket_names,
            balance_by="naming",
        ),
        DemoDomain(
            name="code",
            description="A one-line Python function from words, checked by unit tests.",
            rubric_spec=CODE_RUBRIC,
            draw=_draw_code,
            max_new_tokens=40,
            demonstrate=_guess_code_operator,
            balance_by="operator",
        ),
        DemoDomain(
            name="parity",
            description="Even or odd; warmed up on guessed labels, so only RL teaches it.",
            rubric_spec=PARITY_RUBRIC,
            draw=_draw_parity,
            max_new_tokens=8,
            demonstrate=_guess_parity,
            warmup_weight=0.25,
        ),
    ]
    if include_tool_use:
        domains.append(
            DemoDomain(
                name="tool_calc",
                description="Multiply two-digit numbers by calling the python tool.",
                rubric_spec=TOOL_CALC_RUBRIC,
                draw=_draw_tool_calc,
                tools=("python",),
                max_new_tokens=32,
            )
        )
    return domains


def get_domain(name: str) -> DemoDomain:
    for domain in demo_domains(include_tool_use=True):
        if domain.name == name:
            return domain
    known = [d.name for d in demo_domains(include_tool_use=True)]
    raise KeyError(f"no demo domain {name!r}; known: {known}")
