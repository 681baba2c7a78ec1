"""`RunSpec`: everything one post-training run needs, as plain JSON-able data.

A spec is what the console stores for a run and what ``python -m training run spec.json``
reads. ``RunSpec.from_dict`` validates the whole document and raises one `SpecError` that
names *every* bad field by its dotted path (``domains[1].weight: must be >= 0``), so an
operator fixes a spec in one round trip. ``to_dict`` gives back a document that ``from_dict``
accepts unchanged (the round trip is tested).

The sections are declarative pydantic models (`training.validation.SpecModel`: frozen, unknown
keys refused, no coercion): each default and range is stated once, on its field, and
``run_spec_json_schema()`` is the JSON Schema the console publishes. The rules that span fields
(rubric specs, tasks, task sources, DeepSpeed, EWC with ZeRO-3, the mix's weights and names)
are checked on the raw document next to pydantic's pass, so one `SpecError` still lists every
problem. Nothing here imports torch: a web process validating a form does not pay for it.

Sections (all optional except ``base_model`` and ``domains``)::

    {
      "name": "arith-grpo",                 # run id used in provenance and file names
      "base_model": "var/models/demo",       # local Hugging Face directory ("demo" = demo model)
      "seed": 0,
      "max_steps": 20,
      "lr": 1e-5,
      "lr_warmup_steps": 0,                 # lr ramps linearly from lr/N to lr over N steps
      "algorithm": {"algorithm": "grpo", "clip_high": 0.28, ...},   # training.algorithms
      "kl": {"coef": 0.0, "estimator": "k3", "in_reward": false, "reference": true},
      "batch": {"prompts_per_step": 8, "group_size": 4, "micro_batch_tokens": 4096,
                "epochs": 1, "mini_batches": 1, "max_generation_rounds": 1},
      "sampling": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 48},
      "domains": [{"name": "arithmetic", "weight": 1.0, "rubric_spec": {...},
                   "tasks": [...] | "task_source": {"kind": "demo"|"jsonl", ...},
                   "eval_tasks": [...] | "eval_source": {...}, "pass_threshold": 1.0,
                   "sandbox_image": null, "rubric_version": null}],
      "eval": {"every_steps": 0, "tasks_per_domain": 32, "greedy": true},
      "deepspeed": {...},                   # a DeepSpeed config dict (ZeRO stage, precision ...)
      "rollout": {"engine": "hf", ...},     # training.rollout_config.RolloutEngineConfig fields
      "tools": {"enabled": false, "max_turns": 4, "max_tool_output_chars": 2000, ...},
      "checkpoint": {"dir": "var/runs/x/ckpt", "every_steps": 10, "keep_last": 2,
                     "resume": "latest" | "none" | "<path>", "prune": true},
      "ewc": {"strength": 0.0, "fisher_path": null, "anchor_path": null},
      "output_dir": "var/runs/arith-grpo",
      "cpu_threads": 0,                     # torch CPU threads (0: torch's default)
      "autocast": "off"                     # "bf16": trainer passes under torch.autocast
    }

Task sources: ``{"kind": "demo", "domain": "arithmetic", "n": 256, "seed": 0, "split":
"train"}`` draws from `training.demo` (held-out ``eval_source`` defaults to the demo's
``held_out`` split); ``{"kind": "jsonl", "path": "tasks.jsonl"}`` reads one task per line (tasks
naming a ``split`` are kept only in that split). A task is ``{"prompt" | "messages",
"ground_truth", "metadata", "split"}``: the shape and the split names are `training.tasks`.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from training.algorithm_config import ALGORITHM_PRESETS, AlgorithmConfig, KLEstimatorName
from training.rollout_config import RolloutEngineConfig
from training.tasks import TASK_KEYS, Split, task_problem
from training.validation import SpecModel, error_lines, unique, validate_into

__all__ = [
    "BatchSpec",
    "CheckpointSpec",
    "DemoTaskSource",
    "DomainSpec",
    "EWCSpec",
    "EvalSpec",
    "JsonlTaskSource",
    "KLSpec",
    "RunSpec",
    "SamplingSpec",
    "SpecError",
    "ToolSpec",
    "run_spec_json_schema",
]

# DeepSpeed keys the run sets itself from ``batch`` (token-budget micro-batches).
_RUN_OWNED_DEEPSPEED_KEYS = (
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
)


class SpecError(ValueError):
    """A run spec with problems; ``errors`` lists each as ``"<dotted.path>: <problem>"``."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        super().__init__("invalid run spec:\n  " + "\n  ".join(self.errors))


class DemoTaskSource(SpecModel):
    """Tasks drawn from `training.demo` (``domain`` defaults to the domain's own name; ``n``
    to 256 for training and 64 for a held-out source)."""

    kind: Literal["demo"]
    domain: str | None = Field(default=None, min_length=1)
    n: int | None = Field(default=None, ge=1)
    seed: int = Field(default=0, ge=0)
    split: Split | None = None


class JsonlTaskSource(SpecModel):
    """One task object a line (the task shape: ``training.tasks``); ``split`` defaults to the
    split being loaded (``train`` for ``task_source``, ``held_out`` for ``eval_source``)."""

    kind: Literal["jsonl"]
    path: str = Field(min_length=1)
    split: Split | None = None


_TASK_SOURCES: dict[str, type[SpecModel]] = {"demo": DemoTaskSource, "jsonl": JsonlTaskSource}


class DomainSpec(SpecModel):
    """One domain of the mix: its share of each batch, its rubric and where its tasks come from.

    ``weight`` is relative (weights need not sum to 1; a weight of 0 keeps the domain in the
    run, for evaluation, without training on it). ``pass_threshold``: a sample "passes" when its
    reward total is at least this (``pass_rate`` metrics). ``tasks``/``eval_tasks`` are task
    objects; ``task_source``/``eval_source`` a `DemoTaskSource` or `JsonlTaskSource` as a dict.
    """

    name: str = Field(min_length=1, description="unique in the run; no '/' (metric names)")
    rubric_spec: dict[str, Any]
    weight: float = Field(default=1.0, ge=0)
    tasks: list[dict[str, Any]] | None = Field(default=None, min_length=1)
    task_source: dict[str, Any] | None = None
    eval_tasks: list[dict[str, Any]] | None = Field(default=None, min_length=1)
    eval_source: dict[str, Any] | None = None
    pass_threshold: float = 1.0
    max_new_tokens: int | None = Field(default=None, ge=1)
    sandbox_image: str | None = Field(default=None, min_length=1)
    # The console registry's version number of the rubric (trajectories carry it beside the
    # rubric's digest); None for a run not started from the registry (the CLI).
    rubric_version: int | None = Field(default=None, ge=1)
    # The domain's sandbox (a `sandboxes.SandboxSpec` dict: driver, image, limits, network):
    # tool calls run in it, and the rubric's code criteria start from it (the rubric's own
    # `sandbox` block overrides what it names). None: the libraries' defaults.
    sandbox: dict[str, Any] | None = None


class BatchSpec(SpecModel):
    """``prompts_per_step`` prompts, ``group_size`` samples each (the GRPO group).

    ``micro_batch_tokens`` is the token budget of one forward/backward pass (padded tokens:
    rows x longest row); ``mini_batches`` splits a step's batch into that many optimiser
    steps and ``epochs`` repeats them (PPO-style reuse; 1 and 1 is plain on-policy).

    ``max_generation_rounds`` > 1 turns on DAPO's dynamic sampling (verl's
    ``algorithm.filter_groups`` with ``max_num_gen_batches``): while fewer than
    ``prompts_per_step`` groups have rewards that differ, another ``prompts_per_step`` prompts
    are drawn, rolled out and scored, up to this many rounds in all; the step then trains on
    the first ``prompts_per_step`` varied groups (on fewer, if the rounds ran out).
    """

    prompts_per_step: int = Field(default=8, ge=1)
    group_size: int = Field(default=4, ge=1)
    micro_batch_tokens: int = Field(default=4096, ge=16)
    epochs: int = Field(default=1, ge=1)
    mini_batches: int = Field(default=1, ge=1)
    max_generation_rounds: int = Field(default=1, ge=1)


class SamplingSpec(SpecModel):
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_new_tokens: int = Field(default=48, ge=1)


class KLSpec(SpecModel):
    """KL to the frozen base policy. Unset fields keep the algorithm preset's value (PPO and
    REINFORCE++ put k1 in the reward, GRPO k3 in the loss). ``reference`` loads the reference
    model even when the coefficient is 0, so that ``actor/kl`` is still reported and a live
    override can turn it on."""

    coef: float | None = Field(default=None, ge=0)
    estimator: KLEstimatorName | None = None
    in_reward: bool | None = None
    reference: bool = True


class EWCSpec(SpecModel):
    """Elastic weight consolidation: ``strength / 2 * sum F (theta - anchor)^2`` (as
    `training.ewc.EWCPenalty` computes it; Fisher and anchor files may be ``torch.save`` or
    ``.safetensors``).

    ``fisher_path``/``anchor_path`` are ``torch.save``d ``{name: tensor}`` files (from
    `training.ewc.estimate_fisher` at an earlier checkpoint); strength 0 disables it.
    """

    strength: float = Field(default=0.0, ge=0)
    fisher_path: str | None = Field(default=None, min_length=1)
    anchor_path: str | None = Field(default=None, min_length=1)


class ToolSpec(SpecModel):
    """Multi-turn tool use (``training.agent``): limits per episode."""

    enabled: bool = False
    max_turns: int = Field(default=4, ge=1)
    max_tool_output_chars: int = Field(default=2000, ge=0)
    max_total_tokens: int = Field(default=512, ge=1)
    timeout_s: float = Field(default=10.0, gt=0)


class CheckpointSpec(SpecModel):
    """Save every ``every_steps`` steps (0: only on preempt and at the end), keep the last
    ``keep_last``. ``resume``: ``"latest"`` picks up the newest checkpoint in ``dir`` if there
    is one, ``"none"`` always starts fresh, anything else is a checkpoint directory.
    ``prune``: each save removes what ``keep_last`` leaves out of ``dir`` (and checkpoints newer
    than itself, an abandoned timeline); false leaves every checkpoint to the caller, for one
    that knows better which it still needs (the console prunes only what its database has
    superseded, `console.runs.sink`)."""

    dir: str | None = Field(default=None, min_length=1)
    every_steps: int = Field(default=0, ge=0)
    keep_last: int = Field(default=2, ge=1)
    resume: str = Field(default="latest", min_length=1)
    save_final: bool = True
    prune: bool = True


class EvalSpec(SpecModel):
    """Held-out evaluation every ``every_steps`` steps (0: only before the first and after the
    last step), on ``tasks_per_domain`` tasks per domain, greedy unless ``greedy`` is false."""

    every_steps: int = Field(default=0, ge=0)
    tasks_per_domain: int = Field(default=32, ge=0)
    greedy: bool = True
    at_start: bool = True
    at_end: bool = True


class RunSpec(SpecModel):
    base_model: str = Field(
        min_length=1, description="a local Hugging Face model directory, or 'demo'"
    )
    domains: tuple[DomainSpec, ...] = Field(min_length=1, strict=False)
    name: str = Field(default="run", min_length=1)
    seed: int = Field(default=0, ge=0)
    max_steps: int = Field(default=10, ge=0)
    lr: float = Field(default=1e-5, ge=0)
    # The learning rate ramps up linearly over this many steps (verl's lr_warmup_steps): Adam's
    # first updates move every weight by about lr whatever the gradient, and on a freshly
    # warmed-up model that first jolt can break the answer format before any reward is read.
    lr_warmup_steps: int = Field(default=0, ge=0)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    kl: KLSpec = Field(default_factory=KLSpec)
    batch: BatchSpec = Field(default_factory=BatchSpec)
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    # A DeepSpeed config dict (ZeRO stage, precision, clipping); checked by _deepspeed_problems.
    deepspeed: dict[str, Any] = Field(default_factory=dict)
    rollout: RolloutEngineConfig = Field(default_factory=RolloutEngineConfig)
    tools: ToolSpec = Field(default_factory=ToolSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    ewc: EWCSpec = Field(default_factory=EWCSpec)
    output_dir: str | None = Field(default=None, min_length=1)
    # torch's CPU threads for the run (0: torch's default, every core). A job sharing a CPU
    # host with others should take its share, or OpenMP threads spin against each other.
    cpu_threads: int = Field(default=0, ge=0)
    # The trainer's forward and backward passes under torch.autocast at this dtype ("bf16"),
    # weights and optimiser state staying fp32 ("off": all fp32). On a CPU with AMX or
    # AVX512-BF16 the bench model's forward+backward takes about half the time; the update is
    # then no longer the fp32 one (bench/README.md, "The peer").
    autocast: Literal["off", "bf16"] = "off"

    # ---------------------------------------------------------------- derived views

    @property
    def domain_names(self) -> list[str]:
        return [d.name for d in self.domains]

    @property
    def domain_weights(self) -> dict[str, float]:
        return {d.name: d.weight for d in self.domains}

    def algorithm_config(self, kl_coef: float | None = None) -> AlgorithmConfig:
        """The algorithm with this spec's KL section folded in (``kl_coef`` overrides)."""
        data = self.algorithm.to_dict()
        data["kl_coef"] = self.kl_coef if kl_coef is None else kl_coef
        if self.kl.estimator is not None:
            data["kl_estimator"] = self.kl.estimator
        if self.kl.in_reward is not None:
            data["kl_in_reward"] = self.kl.in_reward
        if data["loss_aggregation"] == "seq-mean-token-sum-norm" and (
            data.get("constant_normalizer") is None
        ):
            # Dr.GRPO divides by a constant (TRL: max_completion_length). Left unset, the loss
            # would fall back to each micro-batch's padded width, which differs between
            # micro-batches and brings back the length bias the variant exists to remove.
            data["constant_normalizer"] = float(self.generation_budget)
        return AlgorithmConfig.from_dict(data)

    @property
    def generation_budget(self) -> int:
        """The most response tokens one sample can have: the longest per-turn budget, or the
        episode's total budget when tools are on."""
        longest = max(
            [self.sampling.max_new_tokens]
            + [d.max_new_tokens for d in self.domains if d.max_new_tokens is not None]
        )
        return max(longest, self.tools.max_total_tokens) if self.tools.enabled else longest

    @property
    def kl_coef(self) -> float:
        """The KL coefficient at the start of the run (a live override may change it)."""
        return self.kl.coef if self.kl.coef is not None else self.algorithm.kl_coef

    def rollout_engine_config(self) -> RolloutEngineConfig:
        """The ``rollout`` section (`training.rollout_config.RolloutEngineConfig`)."""
        return self.rollout

    def zero_stage(self) -> int:
        return int(self.deepspeed.get("zero_optimization", {}).get("stage", 0))

    # ---------------------------------------------------------------- (de)serialisation

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def with_changes(self, **changes: Any) -> RunSpec:
        """A copy with top-level sections replaced by dicts or values, re-validated."""
        data = self.to_dict()
        for key, value in changes.items():
            if isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        return RunSpec.from_dict(data)

    @classmethod
    def from_json_file(cls, path: str | Path) -> RunSpec:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise SpecError([f"{path}: not valid JSON ({exc})"]) from None
        except OSError as exc:
            raise SpecError([f"{path}: cannot read ({exc.strerror})"]) from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSpec:
        """Validates ``data``; raises `SpecError` listing every problem with its path."""
        if not isinstance(data, dict):
            raise SpecError([f"spec: must be an object, got {type(data).__name__}"])
        # A section given as null means "the defaults", as an absent one does.
        data = {key: value for key, value in copy.deepcopy(data).items() if value is not None}
        errors: list[str] = []
        spec = None
        try:
            spec = cls.model_validate(data)
        except ValidationError as exc:
            errors += error_lines(exc)
        errors += _document_problems(data)
        if errors or spec is None:
            raise SpecError(unique(errors))
        return spec


def run_spec_json_schema() -> dict[str, Any]:
    """The JSON Schema of a run spec document (what ``RunSpec.from_dict`` takes), for the
    console's OpenAPI. Rules that span fields (rubric specs, task shapes, EWC with ZeRO-3,
    unique domain names, at least one weight > 0) are checked by ``from_dict`` only."""
    schema = RunSpec.model_json_schema(mode="validation")
    defs = schema["$defs"]
    presets = sorted(ALGORITHM_PRESETS)
    # A spec names an algorithm preset, alone or with overrides.
    defs["AlgorithmConfig"]["properties"]["algorithm"] = {
        "enum": presets,
        "description": "a preset (training.algorithm_config.ALGORITHM_PRESETS) the other "
        "fields override",
    }
    schema["properties"]["algorithm"] = {
        "anyOf": [{"$ref": "#/$defs/AlgorithmConfig"}, {"enum": presets}]
    }
    sources = {"oneOf": [{"$ref": "#/$defs/DemoTaskSource"}, {"$ref": "#/$defs/JsonlTaskSource"}]}
    for model in (DemoTaskSource, JsonlTaskSource):
        defs[model.__name__] = model.model_json_schema()
    for key in ("task_source", "eval_source"):
        defs["DomainSpec"]["properties"][key] = {"anyOf": [sources, {"type": "null"}]}
    for key in list(schema["properties"]):
        if "$ref" in schema["properties"][key]:
            # Null means the section's defaults (RunSpec.from_dict).
            schema["properties"][key] = {"anyOf": [schema["properties"][key], {"type": "null"}]}
    return schema


# -------------------------------------------------------------------- rules across fields


def _document_problems(data: dict[str, Any]) -> list[str]:
    """The rules pydantic's per-field checks cannot state, on the raw document (so they are
    reported together with every field error); a value of the wrong type is left to pydantic."""
    problems: list[str] = []
    domains = data.get("domains")
    if isinstance(domains, list):
        problems += _domain_problems(domains)
    deepspeed = data.get("deepspeed")
    if isinstance(deepspeed, dict):
        problems += _deepspeed_problems(deepspeed)
    ewc = data.get("ewc")
    if isinstance(ewc, dict) and _positive(ewc.get("strength")):
        if not (ewc.get("fisher_path") and ewc.get("anchor_path")):
            problems.append("ewc: strength > 0 needs fisher_path and anchor_path")
        zero = deepspeed.get("zero_optimization") if isinstance(deepspeed, dict) else None
        if isinstance(zero, dict) and zero.get("stage") == 3:
            # The penalty reads whole parameters; ZeRO-3 keeps only a shard of each per rank.
            problems.append("ewc: EWC needs whole parameters: use ZeRO stage 0, 1 or 2 with it")
    return problems


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _deepspeed_problems(data: dict[str, Any]) -> list[str]:
    problems = []
    zero = data.get("zero_optimization", {})
    if not isinstance(zero, dict):
        problems.append("deepspeed.zero_optimization: must be an object")
    else:
        stage = zero.get("stage", 0)
        if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
            problems.append(
                f"deepspeed.zero_optimization.stage: must be 0, 1, 2 or 3, got {stage!r}"
            )
    for key in ("bf16", "fp16"):
        section = data.get(key)
        if section is not None and not isinstance(section, dict):
            problems.append(f"deepspeed.{key}: must be an object like {{'enabled': true}}")
    clip = data.get("gradient_clipping")
    if clip is not None and not (
        isinstance(clip, int | float) and not isinstance(clip, bool) and clip >= 0
    ):
        problems.append(f"deepspeed.gradient_clipping: must be a number >= 0, got {clip!r}")
    for key in _RUN_OWNED_DEEPSPEED_KEYS:
        if key in data:
            problems.append(
                f"deepspeed.{key}: set by the run (token-budget micro-batches); use batch.* instead"
            )
    return problems


def _task_problems(tasks: Any, path: str) -> list[str]:
    if not isinstance(tasks, list):
        return []
    problems = []
    for i, task in enumerate(tasks):
        problem = task_problem(task)
        if problem is not None:
            # "messages[0]: ..." reads as a path under the task; a bare message is the task's.
            where, sep, rest = problem.partition(": ")
            inside = sep and where.split("[")[0] in TASK_KEYS
            problems.append(f"{path}[{i}].{where}: {rest}" if inside else f"{path}[{i}]: {problem}")
    return problems


def _source_problems(source: Any, path: str) -> list[str]:
    if not isinstance(source, dict):
        return []
    model = _TASK_SOURCES.get(source.get("kind"))  # type: ignore[arg-type]
    if model is None:
        kinds = ", ".join(_TASK_SOURCES)
        return [f"{path}.kind: must be one of {kinds}, got {source.get('kind')!r}"]
    problems: list[str] = []
    validate_into(model, source, path, problems)
    return problems


def _domain_problems(domains: list[Any]) -> list[str]:
    from rewards.spec import validate_spec

    problems: list[str] = []
    seen: set[str] = set()
    for i, item in enumerate(domains):
        path = f"domains[{i}]"
        if not isinstance(item, dict):
            continue
        name = item.get("name")
        if isinstance(name, str):
            if name in seen:
                problems.append(f"{path}.name: duplicate domain {name!r}")
            elif "/" in name:
                problems.append(f"{path}.name: must not contain '/' (it is part of metric names)")
            seen.add(name)
        rubric_spec = item.get("rubric_spec")
        if isinstance(rubric_spec, dict):
            for issue in validate_spec(rubric_spec):
                where = f"{path}.rubric_spec" + (f".{issue.path}" if issue.path else "")
                problems.append(f"{where}: {issue.message}")
        sandbox = item.get("sandbox")
        if isinstance(sandbox, dict):
            from sandboxes import SandboxSpec, SandboxSpecError

            try:
                SandboxSpec.from_dict(sandbox)
            except SandboxSpecError as error:
                for field_name, message in error.errors.items():
                    problems.append(f"{path}.sandbox.{field_name}: {message}")
        for key in ("tasks", "eval_tasks"):
            problems += _task_problems(item.get(key), f"{path}.{key}")
        for key in ("task_source", "eval_source"):
            problems += _source_problems(item.get(key), f"{path}.{key}")
        has_tasks = item.get("tasks") is not None
        has_source = item.get("task_source") is not None
        if not has_tasks and not has_source:
            problems.append(f"{path}: needs 'tasks' or a 'task_source'")
        if has_tasks and has_source:
            problems.append(f"{path}: give 'tasks' or a 'task_source', not both")
    weights = [d.get("weight", 1.0) for d in domains if isinstance(d, dict)]
    numeric = all(isinstance(w, int | float) and not isinstance(w, bool) for w in weights)
    if weights and numeric and not any(w > 0 for w in weights):
        problems.append("domains: at least one domain needs a weight > 0")
    return problems
