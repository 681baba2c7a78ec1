"""rewards: a rubric engine that turns a model's response into a reward (no Django here).

A rubric is a JSON object (the console stores it; `validate_spec` is the only schema)::

    {
      "version": 1,
      "description": "optional text",
      "criteria": [
        {"name": "correct", "kind": "math_equivalence", "weight": 1.0, "params": {}},
        {"name": "format", "kind": "format_tags", "weight": 0.2,
         "params": {"tags": ["think", "answer"]}, "timeout_s": 5}
      ],
      "aggregate": "weighted_sum",
      "normalize": false,
      "clip": [0, 1],
      "sandbox": {"memory_mb": 512, "timeout_s": 10, "max_concurrency": 4}
    }

``criteria`` (1–64): ``name`` (a letter, then letters, digits, ``_`` or ``-``; unique),
``kind`` (a registered kind: see `criterion_kinds()` for each kind's params and docs),
``weight`` (number ≥ 0, default 1), ``params`` (object, checked against the kind's schema),
``timeout_s`` (optional deadline for this criterion), ``description``.

``aggregate`` (default ``weighted_sum``):
- ``"weighted_sum"``: Σ weight·score; with ``"normalize": true`` divided by Σ weight.
- ``"min"``: the lowest score among criteria of weight > 0.
- ``"product"``: Π score^weight (a score ≤ 0 makes it 0); normalised, the weighted
  geometric mean.
- ``{"gate": "name" | ["a", "b"], "then": "weighted_sum", "threshold": 1.0}``: the ``then``
  aggregate, but 0 unless every gate criterion scored ≥ ``threshold``. Give a gate weight 0
  to use it only as a gate.

``clip`` ``[low, high]`` bounds the total, applied last. ``sandbox`` sets the limits of the
sandboxes code criteria run in (``memory_mb``, ``cpu``, ``pids``, ``disk_mb``, ``timeout_s``,
``output_limit_bytes``, ``open_files``, ``network``, ``image``, ``driver``, ``allow_weaker``;
each number's range and default are ``sandboxes.LIMITS``, the ones a sandbox enforces), how
many run at once (``max_concurrency``, default the CPU count), how many the pool keeps created
ahead (``prewarm``, default 0) and how Python-only runs go (``python_evaluations``:
``"zygote"``, the default, forks a pre-imported Python in one of ``max_concurrency`` long-lived
sandboxes per run; ``"fresh_sandbox"`` starts a new interpreter in a new sandbox per sample;
`rewards.sandboxing` says what each isolates).

Kinds (``python -m rewards kinds``; each documents its params in `criterion_kinds()`):
answers ``exact_match``, ``regex_match``, ``multiple_choice``, ``math_equivalence``;
numbers and documents ``numeric_match``, ``labelled_values``, ``consistency``; structure
``json_schema``, ``format_tags``; code, in a sandbox, ``unit_tests``, ``io_tests``,
``compiles``, ``coverage``, ``static_analysis``, ``runtime_efficiency``; terminal tasks
``check_script``; 3D ``mesh``; efficiency ``length_penalty``, ``brevity_bonus``; models
``reward_model``, ``llm_judge``; user functions ``python_function`` (installed, trusted) and
``sandboxed_function`` (typed by a user, sandboxed). `validate_spec` checks everything a
spec says; what needs the running system (that a ``python_function`` imports, that an
``llm_judge`` engine was handed in) is checked by `Rubric.from_spec`, which raises the same
`RubricSpecError` with the same paths.

Use::

    rubric = Rubric.from_spec(spec)                  # raises RubricSpecError(issues)
    result = rubric.score(Sample(domain="math", prompt="...", completion="... \\boxed{42}",
                                 ground_truth="42"))
    result.total, result.breakdown, result.details
    rubric.score_batch(samples, max_workers=8)       # bounded pool, input order kept

    python -m rewards score --rubric rubric.yaml --samples samples.jsonl   # a table

Many domains: ``RubricRouter.from_specs({"gsm8k": spec_a, "mbpp": spec_b})`` scores each
sample with its domain's rubric (as verl routes by ``data_source``), input order kept.

Numbers in documents (``numeric_match``, ``labelled_values``, ``consistency``) are read as an
analyst reads them (`rewards.amounts`): ``(1,234)`` and ``-$500k`` are negative, k/m/mm/MM/
mn/bn/tn scale, ``50 bps`` is 0.5 %, years, fiscal periods, footnotes and page references are
not answers, and an answer that reads two ways scores low confidence, never full reward.
``consistency`` also checks that totals equal the sum of their stated parts.

Threat model of the code criteria (details in `rewards.criteria.code`): the candidate's code
is hostile and runs only in a sandbox, in a process of its own; the tests and their expected
values live in a separate, non-dumpable judge process forked before they were read, which
talks to the candidate only in plain values, kills every other process of the sandbox before
it reports, and signs its report with a key the candidate never saw. Patching builtins, the
test framework or the exits, printing pass markers, forging records, reading the environment,
the filesystem, /proc or its own memory, or leaving processes behind earns nothing
(``tests/rewards/test_reward_hacking.py`` holds the hacks, in every test format).

A criterion that crashes or overruns its deadline scores 0 with the reason in
``details[name]["error"]``; it never fails the batch. (A criterion that judged and found the
sample wanting says why in ``details[name]["reason"]`` or its own fields instead, so
``"error"`` always means "could not judge".) Model-written code only ever runs inside
a sandbox from the `sandboxes` library.
"""

from rewards.registry import (
    Criterion,
    CriterionContext,
    CriterionKindInfo,
    criterion_kinds,
    register,
)
from rewards.router import RubricRouter
from rewards.rubric import Rubric
from rewards.spec import RUBRIC_SCHEMA, RubricSpecError, SpecIssue, validate_spec
from rewards.types import CriterionError, Outcome, RewardResult, Sample

__all__ = [
    "RUBRIC_SCHEMA",
    "Criterion",
    "CriterionContext",
    "CriterionError",
    "CriterionKindInfo",
    "Outcome",
    "RewardResult",
    "Rubric",
    "RubricRouter",
    "RubricSpecError",
    "Sample",
    "SpecIssue",
    "criterion_kinds",
    "register",
    "validate_spec",
]
