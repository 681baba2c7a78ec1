"""`RunSpec`: everything one post-training run needs, as plain JSON-able data.

A spec is what the console stores for a run and what ``python -m training run spec.json``
reads. ``RunSpec.from_dict`` validates the whole document and raises one `SpecError` that
names *every* bad field by its dotted path (``domains[1].weight: must be >= 0``), so an
operator fixes a spec in one round trip. ``to_dict`` gives back a document that ``from_dict``
accepts unchanged (the round trip is tested).

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
                   "sandbox_image": null}],
      "eval": {"every_steps": 0, "tasks_per_domain": 32, "greedy": true},
      "deepspeed": {...},                   # a DeepSpeed config dict (ZeRO stage, precision ...)
      "rollout": {"engine": "hf", ...},     # training.rollout.base.RolloutEngineConfig fields
      "tools": {"enabled": false, "max_turns": 4, "max_tool_output_chars": 2000, ...},
      "checkpoint": {"dir": "var/runs/x/ckpt", "every_steps": 10, "keep_last": 2,
                     "resume": "latest" | "none" | "<path>"},
      "ewc": {"strength": 0.0, "fisher_path": null, "anchor_path": null},
      "output_dir": "var/runs/arith-grpo",
      "cpu_threads": 0                      # torch CPU threads (0: torch's default)
    }

Task sources: ``{"kind": "demo", "domain": "arithmetic", "n": 256, "seed": 0, "split":
"train"}`` draws from `training.demo` (held-out ``eval_source`` defaults to the demo's
``test`` split); ``{"kind": "jsonl", "path": "tasks.jsonl"}`` reads one task
``{"prompt", "ground_truth", "metadata"}`` per line.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from training.algorithms import AlgorithmConfig

__all__ = [
    "BatchSpec",
    "CheckpointSpec",
    "DomainSpec",
    "EWCSpec",
    "EvalSpec",
    "KLSpec",
    "RunSpec",
    "SamplingSpec",
    "SpecError",
    "ToolSpec",
]

_TASK_SOURCE_KINDS = ("demo", "jsonl")
_ZERO_STAGES = (0, 1, 2, 3)


class SpecError(ValueError):
    """A run spec with problems; ``errors`` lists each as ``"<dotted.path>: <problem>"``."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        super().__init__("invalid run spec:\n  " + "\n  ".join(self.errors))


class _Checker:
    """Collects problems with their paths instead of stopping at the first one."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def add(self, path: str, problem: str) -> None:
        self.errors.append(f"{path}: {problem}")

    def section(self, data: dict[str, Any], key: str, path: str) -> dict[str, Any]:
        value = data.get(key, {})
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.add(path, f"must be an object, got {type(value).__name__}")
            return {}
        return value

    def unknown(self, data: dict[str, Any], known: set[str], path: str) -> None:
        for key in sorted(set(data) - known):
            self.add(f"{path}.{key}" if path else key, "unknown field")

    def number(
        self,
        data: dict[str, Any],
        key: str,
        path: str,
        default: float,
        *,
        low: float | None = None,
        high: float | None = None,
        low_open: bool = False,
    ) -> float:
        value = data.get(key, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            self.add(path, f"must be a finite number, got {value!r}")
            return default
        if low is not None and (value <= low if low_open else value < low):
            self.add(path, f"must be {'>' if low_open else '>='} {low}, got {value}")
        if high is not None and value > high:
            self.add(path, f"must be <= {high}, got {value}")
        return float(value)

    def integer(
        self, data: dict[str, Any], key: str, path: str, default: int, *, low: int | None = None
    ) -> int:
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(path, f"must be an integer, got {value!r}")
            return default
        if low is not None and value < low:
            self.add(path, f"must be >= {low}, got {value}")
        return value

    def boolean(self, data: dict[str, Any], key: str, path: str, default: bool) -> bool:
        value = data.get(key, default)
        if not isinstance(value, bool):
            self.add(path, f"must be true or false, got {value!r}")
            return default
        return value

    def text(
        self,
        data: dict[str, Any],
        key: str,
        path: str,
        default: str | None,
        *,
        choices: tuple[str, ...] | None = None,
    ) -> str | None:
        value = data.get(key, default)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            self.add(path, f"must be a non-empty string, got {value!r}")
            return default
        if choices is not None and value not in choices:
            self.add(path, f"must be one of {', '.join(choices)}, got {value!r}")
        return value


@dataclass(frozen=True)
class DomainSpec:
    """One domain of the mix: its share of each batch, its rubric and where its tasks come from.

    ``weight`` is relative (weights need not sum to 1; a weight of 0 keeps the domain in the
    run, for evaluation, without training on it). ``pass_threshold``: a sample "passes" when its
    reward total is at least this (``pass_rate`` metrics).
    """

    name: str
    rubric_spec: dict[str, Any]
    weight: float = 1.0
    tasks: list[dict[str, Any]] | None = None
    task_source: dict[str, Any] | None = None
    eval_tasks: list[dict[str, Any]] | None = None
    eval_source: dict[str, Any] | None = None
    pass_threshold: float = 1.0
    max_new_tokens: int | None = None
    sandbox_image: str | None = None


@dataclass(frozen=True)
class BatchSpec:
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

    prompts_per_step: int = 8
    group_size: int = 4
    micro_batch_tokens: int = 4096
    epochs: int = 1
    mini_batches: int = 1
    max_generation_rounds: int = 1


@dataclass(frozen=True)
class SamplingSpec:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 48


@dataclass(frozen=True)
class KLSpec:
    """KL to the frozen base policy. Unset fields keep the algorithm preset's value (PPO and
    REINFORCE++ put k1 in the reward, GRPO k3 in the loss). ``reference`` loads the reference
    model even when the coefficient is 0, so that ``actor/kl`` is still reported and a live
    override can turn it on."""

    coef: float | None = None
    estimator: str | None = None
    in_reward: bool | None = None
    reference: bool = True


@dataclass(frozen=True)
class EWCSpec:
    """Elastic weight consolidation: ``strength / 2 * sum F (theta - anchor)^2`` (as
    `training.ewc.EWCPenalty` computes it; Fisher and anchor files may be ``torch.save`` or
    ``.safetensors``).

    ``fisher_path``/``anchor_path`` are ``torch.save``d ``{name: tensor}`` files (from
    `training.ewc.estimate_fisher` at an earlier checkpoint); strength 0 disables it.
    """

    strength: float = 0.0
    fisher_path: str | None = None
    anchor_path: str | None = None


@dataclass(frozen=True)
class ToolSpec:
    """Multi-turn tool use (``training.agent``): limits per episode."""

    enabled: bool = False
    max_turns: int = 4
    max_tool_output_chars: int = 2000
    max_total_tokens: int = 512
    timeout_s: float = 10.0


@dataclass(frozen=True)
class CheckpointSpec:
    """Save every ``every_steps`` steps (0: only on preempt and at the end), keep the last
    ``keep_last``. ``resume``: ``"latest"`` picks up the newest checkpoint in ``dir`` if there
    is one, ``"none"`` always starts fresh, anything else is a checkpoint directory."""

    dir: str | None = None
    every_steps: int = 0
    keep_last: int = 2
    resume: str = "latest"
    save_final: bool = True


@dataclass(frozen=True)
class EvalSpec:
    """Held-out evaluation every ``every_steps`` steps (0: only before the first and after the
    last step), on ``tasks_per_domain`` tasks per domain, greedy unless ``greedy`` is false."""

    every_steps: int = 0
    tasks_per_domain: int = 32
    greedy: bool = True
    at_start: bool = True
    at_end: bool = True


@dataclass(frozen=True)
class RunSpec:
    base_model: str
    domains: tuple[DomainSpec, ...]
    name: str = "run"
    seed: int = 0
    max_steps: int = 10
    lr: float = 1e-5
    # The learning rate ramps up linearly over this many steps (verl's lr_warmup_steps): Adam's
    # first updates move every weight by about lr whatever the gradient, and on a freshly
    # warmed-up model that first jolt can break the answer format before any reward is read.
    lr_warmup_steps: int = 0
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    kl: KLSpec = field(default_factory=KLSpec)
    batch: BatchSpec = field(default_factory=BatchSpec)
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    eval: EvalSpec = field(default_factory=EvalSpec)
    deepspeed: dict[str, Any] = field(default_factory=dict)
    rollout: dict[str, Any] = field(default_factory=dict)
    tools: ToolSpec = field(default_factory=ToolSpec)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    ewc: EWCSpec = field(default_factory=EWCSpec)
    output_dir: str | None = None
    # torch's CPU threads for the run (0: torch's default, every core). A job sharing a CPU
    # host with others should take its share, or OpenMP threads spin against each other.
    cpu_threads: int = 0

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

    def rollout_engine_config(self) -> Any:
        """`training.rollout.base.RolloutEngineConfig` built from the ``rollout`` section."""
        from training.rollout.base import RolloutEngineConfig

        return RolloutEngineConfig(**self.rollout)

    def zero_stage(self) -> int:
        return int(self.deepspeed.get("zero_optimization", {}).get("stage", 0))

    # ---------------------------------------------------------------- (de)serialisation

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["algorithm"] = self.algorithm.to_dict()
        data["domains"] = [asdict(d) for d in self.domains]
        return json.loads(json.dumps(data))

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
        data = copy.deepcopy(data)
        check = _Checker()
        top_known = {f.name for f in fields(cls)}
        check.unknown(data, top_known, "")

        base_model = data.get("base_model")
        if not isinstance(base_model, str) or not base_model:
            check.add("base_model", "required: a local model directory (or 'demo')")
            base_model = ""
        name = check.text(data, "name", "name", "run") or "run"
        seed = check.integer(data, "seed", "seed", 0, low=0)
        max_steps = check.integer(data, "max_steps", "max_steps", 10, low=0)
        lr = check.number(data, "lr", "lr", 1e-5, low=0.0)
        lr_warmup_steps = check.integer(data, "lr_warmup_steps", "lr_warmup_steps", 0, low=0)

        algorithm = _algorithm(check, data)
        kl = _kl(check, check.section(data, "kl", "kl"))
        batch = _batch(check, check.section(data, "batch", "batch"))
        sampling = _sampling(check, check.section(data, "sampling", "sampling"))
        evaluation = _eval(check, check.section(data, "eval", "eval"))
        tools = _tools(check, check.section(data, "tools", "tools"))
        checkpoint = _checkpoint(check, check.section(data, "checkpoint", "checkpoint"))
        ewc = _ewc(check, check.section(data, "ewc", "ewc"))
        deepspeed_config = _deepspeed(check, check.section(data, "deepspeed", "deepspeed"))
        rollout = _rollout(check, check.section(data, "rollout", "rollout"))
        domains = _domains(check, data.get("domains"))
        output_dir = check.text(data, "output_dir", "output_dir", None)
        cpu_threads = check.integer(data, "cpu_threads", "cpu_threads", 0, low=0)
        zero = deepspeed_config.get("zero_optimization")
        if ewc.strength > 0 and isinstance(zero, dict) and zero.get("stage") == 3:
            # The penalty reads whole parameters; ZeRO-3 keeps only a shard of each per rank.
            check.add("ewc", "EWC needs whole parameters: use ZeRO stage 0, 1 or 2 with it")

        if check.errors:
            raise SpecError(check.errors)
        return cls(
            base_model=base_model,
            domains=tuple(domains),
            name=name,
            seed=seed,
            max_steps=max_steps,
            lr=lr,
            lr_warmup_steps=lr_warmup_steps,
            algorithm=algorithm,
            kl=kl,
            batch=batch,
            sampling=sampling,
            eval=evaluation,
            deepspeed=deepspeed_config,
            rollout=rollout,
            tools=tools,
            checkpoint=checkpoint,
            ewc=ewc,
            output_dir=output_dir,
            cpu_threads=cpu_threads,
        )


# -------------------------------------------------------------------- sections


def _algorithm(check: _Checker, data: dict[str, Any]) -> AlgorithmConfig:
    raw = data.get("algorithm", {"algorithm": "grpo"})
    if isinstance(raw, str):
        raw = {"algorithm": raw}
    if not isinstance(raw, dict):
        check.add("algorithm", f"must be an object or a preset name, got {type(raw).__name__}")
        return AlgorithmConfig()
    try:
        return AlgorithmConfig.from_dict(raw)
    except (ValueError, TypeError) as exc:
        message = str(exc).removeprefix("invalid algorithm config: ")
        for part in message.split("; "):
            check.add("algorithm", part)
        return AlgorithmConfig()


def _kl(check: _Checker, data: dict[str, Any]) -> KLSpec:
    check.unknown(data, {f.name for f in fields(KLSpec)}, "kl")
    from training.algorithms import KL_ESTIMATORS

    estimator = check.text(data, "estimator", "kl.estimator", None)
    aliases = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}
    if estimator is not None and aliases.get(estimator, estimator) not in KL_ESTIMATORS:
        check.add("kl.estimator", f"must be one of {', '.join(KL_ESTIMATORS)}, got {estimator!r}")
    coef = None
    if data.get("coef") is not None:
        coef = check.number(data, "coef", "kl.coef", 0.0, low=0.0)
    in_reward = None
    if data.get("in_reward") is not None:
        in_reward = check.boolean(data, "in_reward", "kl.in_reward", False)
    return KLSpec(
        coef=coef,
        estimator=estimator,
        in_reward=in_reward,
        reference=check.boolean(data, "reference", "kl.reference", True),
    )


def _batch(check: _Checker, data: dict[str, Any]) -> BatchSpec:
    check.unknown(data, {f.name for f in fields(BatchSpec)}, "batch")
    return BatchSpec(
        prompts_per_step=check.integer(
            data, "prompts_per_step", "batch.prompts_per_step", 8, low=1
        ),
        group_size=check.integer(data, "group_size", "batch.group_size", 4, low=1),
        micro_batch_tokens=check.integer(
            data, "micro_batch_tokens", "batch.micro_batch_tokens", 4096, low=16
        ),
        epochs=check.integer(data, "epochs", "batch.epochs", 1, low=1),
        mini_batches=check.integer(data, "mini_batches", "batch.mini_batches", 1, low=1),
        max_generation_rounds=check.integer(
            data, "max_generation_rounds", "batch.max_generation_rounds", 1, low=1
        ),
    )


def _sampling(check: _Checker, data: dict[str, Any]) -> SamplingSpec:
    check.unknown(data, {f.name for f in fields(SamplingSpec)}, "sampling")
    return SamplingSpec(
        temperature=check.number(data, "temperature", "sampling.temperature", 1.0, low=0.0),
        top_p=check.number(data, "top_p", "sampling.top_p", 1.0, low=0.0, high=1.0, low_open=True),
        max_new_tokens=check.integer(data, "max_new_tokens", "sampling.max_new_tokens", 48, low=1),
    )


def _eval(check: _Checker, data: dict[str, Any]) -> EvalSpec:
    check.unknown(data, {f.name for f in fields(EvalSpec)}, "eval")
    return EvalSpec(
        every_steps=check.integer(data, "every_steps", "eval.every_steps", 0, low=0),
        tasks_per_domain=check.integer(
            data, "tasks_per_domain", "eval.tasks_per_domain", 32, low=0
        ),
        greedy=check.boolean(data, "greedy", "eval.greedy", True),
        at_start=check.boolean(data, "at_start", "eval.at_start", True),
        at_end=check.boolean(data, "at_end", "eval.at_end", True),
    )


def _tools(check: _Checker, data: dict[str, Any]) -> ToolSpec:
    check.unknown(data, {f.name for f in fields(ToolSpec)}, "tools")
    return ToolSpec(
        enabled=check.boolean(data, "enabled", "tools.enabled", False),
        max_turns=check.integer(data, "max_turns", "tools.max_turns", 4, low=1),
        max_tool_output_chars=check.integer(
            data, "max_tool_output_chars", "tools.max_tool_output_chars", 2000, low=0
        ),
        max_total_tokens=check.integer(
            data, "max_total_tokens", "tools.max_total_tokens", 512, low=1
        ),
        timeout_s=check.number(data, "timeout_s", "tools.timeout_s", 10.0, low=0.0, low_open=True),
    )


def _checkpoint(check: _Checker, data: dict[str, Any]) -> CheckpointSpec:
    check.unknown(data, {f.name for f in fields(CheckpointSpec)}, "checkpoint")
    return CheckpointSpec(
        dir=check.text(data, "dir", "checkpoint.dir", None),
        every_steps=check.integer(data, "every_steps", "checkpoint.every_steps", 0, low=0),
        keep_last=check.integer(data, "keep_last", "checkpoint.keep_last", 2, low=1),
        resume=check.text(data, "resume", "checkpoint.resume", "latest") or "latest",
        save_final=check.boolean(data, "save_final", "checkpoint.save_final", True),
    )


def _ewc(check: _Checker, data: dict[str, Any]) -> EWCSpec:
    check.unknown(data, {f.name for f in fields(EWCSpec)}, "ewc")
    spec = EWCSpec(
        strength=check.number(data, "strength", "ewc.strength", 0.0, low=0.0),
        fisher_path=check.text(data, "fisher_path", "ewc.fisher_path", None),
        anchor_path=check.text(data, "anchor_path", "ewc.anchor_path", None),
    )
    if spec.strength > 0 and not (spec.fisher_path and spec.anchor_path):
        check.add("ewc", "strength > 0 needs fisher_path and anchor_path")
    return spec


def _deepspeed(check: _Checker, data: dict[str, Any]) -> dict[str, Any]:
    zero = data.get("zero_optimization", {})
    if not isinstance(zero, dict):
        check.add("deepspeed.zero_optimization", "must be an object")
    else:
        stage = zero.get("stage", 0)
        if stage not in _ZERO_STAGES:
            check.add("deepspeed.zero_optimization.stage", f"must be 0, 1, 2 or 3, got {stage!r}")
    for key in ("bf16", "fp16"):
        section = data.get(key)
        if section is not None and not isinstance(section, dict):
            check.add(f"deepspeed.{key}", "must be an object like {'enabled': true}")
    clip = data.get("gradient_clipping")
    if clip is not None and (
        isinstance(clip, bool) or not isinstance(clip, int | float) or clip < 0
    ):
        check.add("deepspeed.gradient_clipping", f"must be a number >= 0, got {clip!r}")
    for key in (
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
    ):
        if key in data:
            check.add(
                f"deepspeed.{key}",
                "set by the run (token-budget micro-batches); use batch.* instead",
            )
    return data


def _rollout(check: _Checker, data: dict[str, Any]) -> dict[str, Any]:
    from training.rollout.base import RolloutEngineConfig, validate_engine_config_fields

    check.unknown(data, {f.name for f in fields(RolloutEngineConfig)}, "rollout")
    for problem in validate_engine_config_fields(data):
        check.add(f"rollout.{problem.split(':', 1)[0]}", problem.split(":", 1)[-1].strip())
    return data


def _task_source(check: _Checker, source: Any, path: str) -> dict[str, Any] | None:
    if source is None:
        return None
    if not isinstance(source, dict):
        check.add(path, "must be an object like {'kind': 'demo'} or {'kind': 'jsonl', 'path': ...}")
        return None
    kind = source.get("kind")
    if kind not in _TASK_SOURCE_KINDS:
        check.add(f"{path}.kind", f"must be one of {', '.join(_TASK_SOURCE_KINDS)}, got {kind!r}")
    elif kind == "jsonl" and not isinstance(source.get("path"), str):
        check.add(f"{path}.path", "required for a jsonl source")
    elif kind == "demo":
        check.unknown(source, {"kind", "domain", "n", "seed", "split"}, path)
        check.integer(source, "n", f"{path}.n", 256, low=1)
        check.integer(source, "seed", f"{path}.seed", 0, low=0)
        check.text(source, "split", f"{path}.split", "train", choices=("train", "test"))
    return source


def _tasks(check: _Checker, tasks: Any, path: str) -> list[dict[str, Any]] | None:
    if tasks is None:
        return None
    if not isinstance(tasks, list) or not tasks:
        check.add(path, "must be a non-empty list of tasks")
        return None
    for i, task in enumerate(tasks):
        if not isinstance(task, dict) or not isinstance(task.get("prompt"), str):
            check.add(f"{path}[{i}]", "a task is an object with a string 'prompt'")
    return tasks


def _domains(check: _Checker, raw: Any) -> list[DomainSpec]:
    if not isinstance(raw, list) or not raw:
        check.add("domains", "required: a non-empty list of domains")
        return []
    known = {f.name for f in fields(DomainSpec)}
    domains: list[DomainSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        path = f"domains[{i}]"
        if not isinstance(item, dict):
            check.add(path, "must be an object")
            continue
        check.unknown(item, known, path)
        name = check.text(item, "name", f"{path}.name", None)
        if name is None:
            check.add(f"{path}.name", "required")
            name = f"domain{i}"
        elif name in seen:
            check.add(f"{path}.name", f"duplicate domain {name!r}")
        elif "/" in name:
            check.add(f"{path}.name", "must not contain '/' (it is part of metric names)")
        seen.add(name)
        rubric_spec = item.get("rubric_spec")
        if not isinstance(rubric_spec, dict):
            check.add(f"{path}.rubric_spec", "required: a rewards rubric spec object")
            rubric_spec = {}
        else:
            from rewards.spec import validate_spec

            for issue in validate_spec(rubric_spec):
                where = f"{path}.rubric_spec" + (f".{issue.path}" if issue.path else "")
                check.add(where, issue.message)
        tasks = _tasks(check, item.get("tasks"), f"{path}.tasks")
        source = _task_source(check, item.get("task_source"), f"{path}.task_source")
        if tasks is None and source is None:
            check.add(path, "needs 'tasks' or a 'task_source'")
        if tasks is not None and source is not None:
            check.add(path, "give 'tasks' or a 'task_source', not both")
        max_new = item.get("max_new_tokens")
        if max_new is not None:
            max_new = check.integer(item, "max_new_tokens", f"{path}.max_new_tokens", 48, low=1)
        domains.append(
            DomainSpec(
                name=name,
                rubric_spec=rubric_spec,
                weight=check.number(item, "weight", f"{path}.weight", 1.0, low=0.0),
                tasks=tasks,
                task_source=source,
                eval_tasks=_tasks(check, item.get("eval_tasks"), f"{path}.eval_tasks"),
                eval_source=_task_source(check, item.get("eval_source"), f"{path}.eval_source"),
                pass_threshold=check.number(item, "pass_threshold", f"{path}.pass_threshold", 1.0),
                max_new_tokens=max_new,
                sandbox_image=check.text(item, "sandbox_image", f"{path}.sandbox_image", None),
            )
        )
    if domains and not any(d.weight > 0 for d in domains):
        check.add("domains", "at least one domain needs a weight > 0")
    return domains
