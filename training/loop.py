"""`run(spec, sink, control)`: the closed loop generate → (tools) → score → update → sync.

One step (`_Run.train_step`; the values passed between stages are named in `training.step`):

1. ``control.poll(step)`` (in `run`): cancel, preempt (checkpoint, then return), live
   overrides (domain weights, KL coefficient, temperature; each change is an event).
2. **Rollout** (`_Run.rollout_and_score` → `Rollouts`): a domain-mixed draw of
   ``prompts_per_step`` tasks, each domain in proportion to its weight (`DomainMixSampler`:
   largest remainder with a carried deficit, so over steps each domain's share converges
   exactly to its weight even when a step cannot split evenly), each domain's tasks reshuffled
   every epoch; prompt groups sharded round-robin over the ranks; ``group_size`` samples per
   prompt on this rank's rollout engine (tasks with tools run as multi-turn episodes in
   sandboxes through `training.agent` when tools are on); each scored by the domain's rubric
   (`rewards.Rubric.from_spec(...).score_batch`). DAPO's dynamic sampling repeats the round.
3. **Recompute** (`_Run.recompute` → `Recomputed`): the forward-only passes the step needs:
   reference log-probabilities, the policy's own (KL in the reward; the old log-probabilities
   when a batch is used more than once), value estimates.
4. **Advantages** (`training.step.compute_step_advantages` → `Advantages`): KL in the reward
   if asked, the estimator (`training.algorithms.compute_advantages`, groups never span
   ranks), zero-variance groups dropped if the algorithm says so (DAPO); then
   `build_update_batch` → `UpdateBatch`, one trainer row per assistant turn.
5. **Update** (`_Run.update` → `UpdateResult`): `Trainer.train_step` over token-budget
   micro-batches, ``epochs`` x ``mini_batches`` optimiser steps.
6. **Sync** (`_Run.sync_weights`): the new policy version into the rollout engine.
7. **Record** (`_Run.record_step`): metrics, trajectories (with reward breakdown and
   provenance), the ``step.timeline`` event; a policy that has collapsed (one answer per
   prompt while still mostly wrong, or spread out until every answer fails: no gradient
   left) raises a ``run.collapsed`` event, and ``run.collapse_recovered`` if it comes back.
   Then (in `run`) checkpoints every N steps and held-out evaluation.

Determinism: sampling seeds derive from ``(seed, step, rank)``, the sampler's state and every
RNG are in the checkpoint, so a run resumed from step k produces at step k+1 the same metrics
as a run that was never interrupted (CPU, fixed seed; tested).

Distributed: every rank runs this function (``deepspeed``/``torchrun`` launcher). Rank 0 polls
the control and broadcasts its decision, gathers samples for metrics and trajectories, and is
the only one that writes to the sink.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import socket
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.algorithm_config import AlgorithmConfig
from training.batching import shard_groups
from training.checkpoint import find_latest, load_checkpoint, save_checkpoint
from training.control import Control, ControlDecision, Overrides
from training.metrics import CollapseDetector, SampleRecord, eval_metrics, sample_metrics
from training.sink import NullSink, QueueingSink, Sink
from training.spec import DomainSpec, RunSpec
from training.step import (
    Advantages,
    Recomputed,
    Rollouts,
    Sample,
    UpdateBatch,
    UpdateResult,
    build_update_batch,
    compute_step_advantages,
    per_sample_tokens,
)
from training.tasks import HELD_OUT, TRAIN, task_problem, with_engine_prompt
from training.threads import set_cpu_threads

__all__ = ["DomainMixSampler", "RunOutcome", "load_tasks", "mix_counts", "run"]


@dataclass
class RunOutcome:
    status: str  # "completed" | "preempted" | "cancelled" | "failed"
    step: int  # steps completed (the next step to run on resume)
    checkpoint: str | None = None
    error: str | None = None
    final_metrics: dict[str, float] = field(default_factory=dict)
    eval_history: list[tuple[int, dict[str, float]]] = field(default_factory=list)


# ------------------------------------------------------------------------------ tasks


def _read_jsonl(path: str, split: str) -> list[dict[str, Any]]:
    """The tasks of ``split`` in a JSONL file: every line is checked against the task shape
    (`training.tasks`); a task naming another split is left out."""
    tasks = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                task = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc})") from None
            problem = task_problem(task)
            if problem is not None:
                raise ValueError(f"{path}:{number}: {problem}")
            if task.get("split", split) == split:
                tasks.append(task)
    if not tasks:
        raise ValueError(f"{path}: no {split} tasks")
    return tasks


def _from_source(domain: DomainSpec, source: dict[str, Any], split: str) -> list[dict[str, Any]]:
    if source["kind"] == "jsonl":
        return _read_jsonl(source["path"], split)
    from training.demo.domains import get_domain

    demo = get_domain(source.get("domain") or domain.name)
    n = source.get("n") or (256 if split == TRAIN else 64)
    return demo.make_tasks(int(n), int(source.get("seed", 0)), split)


def load_tasks(domain: DomainSpec, split: str = TRAIN) -> list[dict[str, Any]]:
    """The domain's training tasks, or its held-out ones (``split="held_out"``: ``eval_tasks``,
    ``eval_source``, else the demo source's held-out split, else none). Tasks are as given:
    `training.tasks.with_engine_prompt` renders a messages-only task's prompt."""
    if split == TRAIN:
        if domain.tasks is not None:
            return list(domain.tasks)
        assert domain.task_source is not None
        return _from_source(domain, domain.task_source, source_split(domain.task_source))
    if domain.eval_tasks is not None:
        return list(domain.eval_tasks)
    if domain.eval_source is not None:
        return _from_source(domain, domain.eval_source, source_split(domain.eval_source, HELD_OUT))
    if domain.task_source is not None and domain.task_source.get("kind") == "demo":
        return _from_source(domain, {**domain.task_source, "split": HELD_OUT}, HELD_OUT)
    return []


def source_split(source: dict[str, Any], default: str = TRAIN) -> str:
    return str(source.get("split") or default)


# ------------------------------------------------------------------------------ mixing


def mix_counts(
    weights: dict[str, float], total: int, carry: dict[str, float] | None = None
) -> tuple[dict[str, int], dict[str, float]]:
    """Splits ``total`` prompts over domains in proportion to ``weights``.

    Largest remainder on ``total * share + carry``; the carry (what each domain was owed or
    got in excess so far) makes the long-run shares exact. Returns ``(counts, new_carry)``.
    """
    carry = dict(carry or {})
    positive = {name: w for name, w in weights.items() if w > 0}
    weight_sum = sum(positive.values())
    if weight_sum <= 0:
        raise ValueError("at least one domain needs a weight > 0")
    ideal = {
        name: total * positive.get(name, 0.0) / weight_sum + carry.get(name, 0.0)
        for name in weights
    }
    counts = {name: max(0, math.floor(value)) for name, value in ideal.items()}
    left = total - sum(counts.values())
    order = sorted(
        (name for name in weights if positive.get(name, 0.0) > 0),
        key=lambda name: (-(ideal[name] - math.floor(ideal[name])), list(weights).index(name)),
    )
    i = 0
    while left > 0 and order:
        counts[order[i % len(order)]] += 1
        left -= 1
        i += 1
    while left < 0:  # a large negative carry can leave too many; take from the largest
        name = max(counts, key=lambda n: counts[n])
        counts[name] -= 1
        left += 1
    new_carry = {
        name: (total * positive.get(name, 0.0) / weight_sum + carry.get(name, 0.0)) - counts[name]
        for name in weights
    }
    return counts, new_carry


class DomainMixSampler:
    """Draws each step's tasks: per-domain shuffles (a new permutation each epoch, from the
    seed), counts from `mix_counts`. Its whole state is `state_dict` (checkpointed)."""

    def __init__(self, tasks: dict[str, list[dict[str, Any]]], seed: int) -> None:
        self.tasks = tasks
        self.seed = seed
        self.cursor = dict.fromkeys(tasks, 0)
        self.epoch = dict.fromkeys(tasks, 0)
        self.carry: dict[str, float] = dict.fromkeys(tasks, 0.0)

    def _order(self, name: str) -> list[int]:
        domain_index = list(self.tasks).index(name)
        rng = np.random.default_rng([self.seed, domain_index, self.epoch[name]])
        return [int(i) for i in rng.permutation(len(self.tasks[name]))]

    def _take(self, name: str, count: int) -> list[dict[str, Any]]:
        taken = []
        order = self._order(name)
        for _ in range(count):
            if self.cursor[name] >= len(order):
                self.epoch[name] += 1
                self.cursor[name] = 0
                order = self._order(name)
            taken.append(self.tasks[name][order[self.cursor[name]]])
            self.cursor[name] += 1
        return taken

    def draw(self, weights: dict[str, float], total: int) -> list[tuple[str, dict[str, Any]]]:
        counts, self.carry = mix_counts(weights, total, self.carry)
        drawn: list[tuple[str, dict[str, Any]]] = []
        for name in self.tasks:
            drawn.extend((name, task) for task in self._take(name, counts.get(name, 0)))
        return drawn

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": dict(self.cursor), "epoch": dict(self.epoch), "carry": dict(self.carry)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor = {k: int(v) for k, v in state["cursor"].items()}
        self.epoch = {k: int(v) for k, v in state["epoch"].items()}
        self.carry = {k: float(v) for k, v in state["carry"].items()}


# ------------------------------------------------------------------------------ distributed


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def _broadcast_from_rank0(value: Any, rank: int, world: int) -> Any:
    """Rank 0's ``value`` on every rank (torch.distributed; not the console's broadcasts)."""
    if world == 1:
        return value
    holder = [value if rank == 0 else None]
    _dist().broadcast_object_list(holder, src=0)
    return holder[0]


def _gather(items: list[Any], world: int) -> list[Any]:
    if world == 1:
        return items
    gathered: list[Any] = [None] * world
    _dist().all_gather_object(gathered, items)
    return [item for part in gathered for item in part]


def _seed_for(*parts: int) -> int:
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def domain_sandbox(settings: dict[str, Any] | None) -> Any:
    """The domain's `sandboxes.SandboxSpec` (None: the libraries' defaults). A bwrap image given
    as a spec is registered in this process under its name, so the rubric's code criteria can
    name it."""
    if settings is None:
        return None
    from sandboxes import SandboxSpec
    from sandboxes.images import ImageSpec, register_image

    sandbox = SandboxSpec.from_dict(settings)
    if isinstance(sandbox.image, ImageSpec):
        register_image(sandbox.image)
    return sandbox


def scoring_rubric_spec(rubric_spec: dict[str, Any], sandbox: Any) -> dict[str, Any]:
    """The rubric spec the run scores with: the domain's sandbox under the rubric's own
    ``sandbox`` block (what the rubric names wins; a rubric asks for what its criteria need)."""
    if sandbox is None:
        return rubric_spec
    from sandboxes import LIMITS
    from sandboxes.images import ImageSpec

    base: dict[str, Any] = {name: getattr(sandbox, name) for name in LIMITS}
    base.update(driver=sandbox.driver, network=sandbox.network)
    if isinstance(sandbox.image, ImageSpec):
        base["image"] = sandbox.image.name
    elif isinstance(sandbox.image, str):
        base["image"] = sandbox.image
    return {**rubric_spec, "sandbox": {**base, **rubric_spec.get("sandbox", {})}}


def _rubric_digest(rubric_spec: dict[str, Any]) -> str:
    canonical = json.dumps(rubric_spec, sort_keys=True, separators=(",", ":"))
    return f"{rubric_spec.get('version', 0)}:{hashlib.sha256(canonical.encode()).hexdigest()[:12]}"


# ------------------------------------------------------------------------------ the run


@dataclass
class _Timeline:
    """This step's stages on this rank, start and end relative to the step's start
    (`StageSpan`); gathered from every rank into the ``step.timeline`` event."""

    rank: int
    started: float = field(default_factory=time.perf_counter)
    spans: list[dict[str, Any]] = field(default_factory=list)
    # Each span names its machine: a run over several hosts draws one lane group per host. The
    # host agent names its host in TRAINING_HOST_NAME (two agents on one machine share its
    # hostname); a run started by hand falls back to the machine's name.
    host: str = field(
        default_factory=lambda: os.environ.get("TRAINING_HOST_NAME") or socket.gethostname()
    )

    def mark(self, stage: str, start: float, end: float, **extra: float) -> None:
        """Adds ``stage`` (``time.perf_counter`` instants) to the timeline."""
        self.spans.append(
            {
                "stage": stage,
                "start_s": round(start - self.started, 6),
                "end_s": round(end - self.started, 6),
                "rank": self.rank,
                "host": self.host,
                **{k: round(v, 6) for k, v in extra.items()},
            }
        )


class _Run:
    def __init__(self, spec: RunSpec, sink: Sink, control: Control) -> None:
        from rewards.rubric import Rubric
        from training.rollout.base import make_engine
        from training.trainer import Trainer

        self.spec = spec
        self.control = control
        self.started = time.perf_counter()
        self.model_dir = _resolve_model(spec.base_model)
        ewc_penalty = None
        if spec.ewc.strength > 0:
            from training.ewc import EWCPenalty

            assert spec.ewc.fisher_path and spec.ewc.anchor_path
            ewc_penalty = EWCPenalty.from_paths(
                spec.ewc.fisher_path, spec.ewc.anchor_path, strength=spec.ewc.strength
            )
        self.trainer = Trainer(
            self.model_dir,
            spec.deepspeed,
            spec.lr,
            seed=spec.seed,
            reference=spec.kl.reference or spec.kl_coef > 0,
            micro_batch_tokens=spec.batch.micro_batch_tokens,
            ewc_penalty=ewc_penalty,
            value_head=spec.algorithm.needs_value_head,
            autocast=spec.autocast,
        )
        self.rank, self.world = self.trainer.rank, self.trainer.world_size
        self.sink: Sink = sink if self.rank == 0 else NullSink()
        self.engine = make_engine(spec.rollout_engine_config(), self.model_dir)
        self.tokenizer = self.trainer.tokenizer
        self.sandboxes = {d.name: domain_sandbox(d.sandbox) for d in spec.domains}
        self.rubrics = {
            d.name: Rubric.from_spec(scoring_rubric_spec(d.rubric_spec, self.sandboxes[d.name]))
            for d in spec.domains
        }
        self.rubric_digests = {d.name: _rubric_digest(d.rubric_spec) for d in spec.domains}
        self.domains = {d.name: d for d in spec.domains}
        self.sampler = DomainMixSampler(
            {d.name: self.engine_tasks(load_tasks(d)) for d in spec.domains}, spec.seed
        )
        empty = [name for name, tasks in self.sampler.tasks.items() if not tasks]
        if empty:
            raise ValueError(f"domains without training tasks: {', '.join(empty)}")
        self.eval_tasks = {d.name: self.engine_tasks(load_tasks(d, HELD_OUT)) for d in spec.domains}
        self.weights = spec.domain_weights
        self.kl_coef = spec.kl_coef
        self.temperature = spec.sampling.temperature
        self.step = 0
        self.tool_seconds = 0.0  # elapsed in tool phases since the step's rollout began
        self.timeline = _Timeline(self.rank, self.started)
        self.eval_history: list[tuple[int, dict[str, float]]] = []
        self.last_checkpoint: str | None = None
        self.collapse = CollapseDetector()

    def engine_tasks(self, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each task with the prompt text the engine is given (a messages-only task's chat,
        rendered once by the model's chat template)."""
        return [with_engine_prompt(task, self.tokenizer) for task in tasks]

    # -------------------------------------------------------------- state

    def run_state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "sampler": self.sampler.state_dict(),
            "weights": self.weights,
            "kl_coef": self.kl_coef,
            "temperature": self.temperature,
            "spec_name": self.spec.name,
        }

    def save(self, reason: str) -> str | None:
        root = self.spec.checkpoint.dir
        if root is None:
            return None
        policy = self.spec.checkpoint
        path = save_checkpoint(
            self.trainer,
            root,
            self.step,
            self.run_state(),
            policy.keep_last if policy.prune else None,
        )
        self.last_checkpoint = str(path)
        self.sink.checkpoint(
            {"step": self.step, "path": str(path), "reason": reason, "policy_version": self.step}
        )
        return str(path)

    def maybe_resume(self) -> None:
        setting = self.spec.checkpoint.resume
        if setting == "none":
            return
        if setting == "latest":
            if self.spec.checkpoint.dir is None:
                return
            path = find_latest(self.spec.checkpoint.dir)
            if path is None:
                return
        else:
            path = Path(setting)
        state = load_checkpoint(self.trainer, path)
        self.step = int(state["step"])
        self.sampler.load_state_dict(state["sampler"])
        self.weights = {k: float(v) for k, v in state["weights"].items()}
        self.kl_coef = float(state["kl_coef"])
        self.temperature = float(state["temperature"])
        self.sync_weights()
        self.last_checkpoint = str(path)  # what a run that fails before its next save has
        self.sink.event("run.resumed", {"step": self.step, "checkpoint": str(path)})

    def sync_weights(self) -> float:
        """The sync stage: the policy's weights into the rollout engine (policy version =
        steps done). Returns its seconds."""
        started = time.perf_counter()
        self.engine.update_weights(self.trainer.named_tensors(), self.step)
        return time.perf_counter() - started

    # -------------------------------------------------------------- control

    def apply_overrides(self, overrides: Overrides) -> None:
        if overrides.domain_weights is not None:
            unknown = sorted(set(overrides.domain_weights) - set(self.weights))
            if unknown:
                self.sink.event(
                    "control.override_refused",
                    {"step": self.step, "reason": f"unknown domain(s) {', '.join(unknown)}"},
                )
            else:
                new = {**self.weights, **overrides.domain_weights}
                if not any(w > 0 for w in new.values()):
                    self.sink.event(
                        "control.override_refused",
                        {"step": self.step, "reason": "every domain weight would be 0"},
                    )
                elif new != self.weights:
                    self.sink.event(
                        "mix.weights_changed",
                        {"step": self.step, "old": self.weights, "new": new},
                    )
                    self.weights = new
        if overrides.kl_coef is not None and overrides.kl_coef != self.kl_coef:
            if overrides.kl_coef > 0 and self.trainer.reference_model is None:
                self.sink.event(
                    "control.override_refused",
                    {"step": self.step, "reason": "kl_coef > 0 needs kl.reference: true"},
                )
            else:
                self.sink.event(
                    "kl.coef_changed",
                    {"step": self.step, "old": self.kl_coef, "new": overrides.kl_coef},
                )
                self.kl_coef = overrides.kl_coef
        if overrides.temperature is not None and overrides.temperature != self.temperature:
            self.sink.event(
                "sampling.temperature_changed",
                {"step": self.step, "old": self.temperature, "new": overrides.temperature},
            )
            self.temperature = overrides.temperature

    # -------------------------------------------------------------- rollout

    def _max_new_tokens(self, domain: str, task: dict[str, Any]) -> int:
        configured = self.domains[domain].max_new_tokens
        if configured is not None:
            return configured
        return min(
            int(task.get("metadata", {}).get("max_new_tokens", self.spec.sampling.max_new_tokens)),
            self.spec.sampling.max_new_tokens,
        )

    def rollout(
        self,
        items: Sequence[tuple[int, str, dict[str, Any]]],
        n: int,
        temperature: float,
        seed: int,
    ) -> list[Sample]:
        """``n`` samples for each ``(group, domain, task)``; tool tasks as agent episodes."""
        from training.rollout.base import SamplingConfig

        results: list[Sample] = []
        plain = [it for it in items if not self._uses_tools(it[2])]
        with_tools = [it for it in items if self._uses_tools(it[2])]
        by_limit: dict[int, list[tuple[int, str, dict[str, Any]]]] = {}
        for item in plain:
            by_limit.setdefault(self._max_new_tokens(item[1], item[2]), []).append(item)
        for limit, chunk in sorted(by_limit.items()):
            sampling = SamplingConfig(
                temperature=temperature,
                top_p=self.spec.sampling.top_p,
                max_new_tokens=limit,
                n=n,
                seed=_seed_for(seed, limit),
            )
            outputs = self.engine.generate([task["prompt"] for _, _, task in chunk], sampling)
            for (group, domain, task), samples in zip(chunk, outputs, strict=True):
                for out in samples:
                    results.append(
                        Sample(
                            domain=domain,
                            group=group,
                            task=task,
                            prompt_ids=list(out.prompt_token_ids),
                            response_ids=list(out.token_ids),
                            logprobs=list(out.logprobs),
                            text=out.text,
                            finish_reason=out.finish_reason,
                            policy_version=out.policy_version,
                        )
                    )
        by_domain: dict[str, list[tuple[int, str, dict[str, Any]]]] = {}
        for item in with_tools:
            by_domain.setdefault(item[1], []).append(item)
        for domain_items in by_domain.values():
            # One domain at a time: its episodes run in that domain's sandbox.
            results.extend(self._episodes(domain_items, n, temperature, seed))
        order = {id(item[2]): i for i, item in enumerate(items)}
        results.sort(key=lambda s: order[id(s.task)])
        return results

    def _uses_tools(self, task: dict[str, Any]) -> bool:
        return self.spec.tools.enabled and bool(task.get("metadata", {}).get("tools"))

    def _episodes(
        self,
        items: Sequence[tuple[int, str, dict[str, Any]]],
        n: int,
        temperature: float,
        seed: int,
    ) -> list[Sample]:
        from training.agent import AgentConfig, run_episodes
        from training.rollout.base import SamplingConfig

        tools = self.spec.tools
        sandbox = self.sandboxes.get(items[0][1]) if items else None
        config = AgentConfig(
            max_turns=tools.max_turns,
            max_total_tokens=tools.max_total_tokens,
            max_new_tokens_per_turn=self.spec.sampling.max_new_tokens,
            tool_timeout_s=tools.timeout_s,
            observation_max_chars=max(1, tools.max_tool_output_chars),
            **({"sandbox": sandbox} if sandbox is not None else {}),
        )
        sampling = SamplingConfig(
            temperature=temperature,
            top_p=self.spec.sampling.top_p,
            max_new_tokens=self.spec.sampling.max_new_tokens,
            n=n,
            seed=_seed_for(seed, -1),
        )
        phase: dict[str, float] = {}
        episodes = run_episodes(
            self.engine, [task for _, _, task in items], sampling, config, timings=phase
        )
        self.tool_seconds += phase.get("tools_s", 0.0)
        results = []
        for index, episode in enumerate(episodes):
            group, domain, task = items[index // n]
            turns = [
                (list(s.output.prompt_token_ids), list(s.output.token_ids), list(s.output.logprobs))
                for s in episode.steps
            ]
            observations = [
                {
                    "tool": o.tool,
                    "stdout": o.stdout,
                    "stderr": o.stderr,
                    "exit_code": o.exit_code,
                    "timed_out": o.timed_out,
                    "wall_s": o.wall_s,
                }
                for s in episode.steps
                for o in s.observations
            ]
            last = episode.steps[-1].output if episode.steps else None
            results.append(
                Sample(
                    domain=domain,
                    group=group,
                    task=task,
                    prompt_ids=turns[0][0] if turns else [],
                    response_ids=[t for turn in turns for t in turn[1]],
                    logprobs=[lp for turn in turns for lp in turn[2]],
                    text=episode.completion,
                    finish_reason="length" if episode.finish_reason != "answer" else "stop",
                    policy_version=last.policy_version if last else self.step,
                    messages=episode.messages,
                    turns=turns,
                    observations=observations,
                    sandbox_image=episode.sandbox_image,
                )
            )
        return results

    # -------------------------------------------------------------- reward

    def score(self, samples: list[Sample]) -> None:
        by_domain: dict[str, list[Sample]] = {}
        for sample in samples:
            by_domain.setdefault(sample.domain, []).append(sample)
        for domain, items in by_domain.items():
            payload = []
            for s in items:
                metadata = dict(s.task.get("metadata", {}))
                metadata.setdefault("num_tokens", len(s.response_ids))
                entry: dict[str, Any] = {
                    "domain": domain,
                    "prompt": s.task["prompt"],
                    "ground_truth": s.task.get("ground_truth"),
                    "metadata": metadata,
                }
                if s.messages is not None:
                    entry["messages"] = s.messages
                else:
                    entry["completion"] = s.text
                payload.append(entry)
            for s, result in zip(items, self.rubrics[domain].score_batch(payload), strict=True):
                s.reward = float(result.total)
                s.breakdown = {k: float(v) for k, v in result.breakdown.items()}
                s.details = result.details

    def sample_record(self, s: Sample) -> SampleRecord:
        return SampleRecord(
            domain=s.domain,
            group=s.group,
            reward=s.reward,
            breakdown=s.breakdown,
            passed=s.reward >= self.domains[s.domain].pass_threshold,
            response_length=len(s.response_ids),
            prompt_length=len(s.prompt_ids),
            clipped=s.finish_reason == "length",
        )

    # -------------------------------------------------------------- one step

    def train_step(self) -> dict[str, float]:
        """One step, stage by stage (`training.step` names what passes between them)."""
        self.timeline = _Timeline(self.rank)
        algorithm = self.spec.algorithm_config(kl_coef=self.kl_coef)
        rollouts = self.rollout_and_score()
        started = time.perf_counter()
        recomputed = self.recompute(rollouts.trained, algorithm)
        updating = started
        if (recomputed.ref_logprobs, recomputed.old_logprobs, recomputed.values) != (None,) * 3:
            # The reference/old log-prob (and value) passes, apart from the update they feed.
            updating = time.perf_counter()
            self.timeline.mark("logprobs", started, updating)
        advantages = compute_step_advantages(rollouts.trained, recomputed, algorithm, self.kl_coef)
        for sample, kept in zip(rollouts.trained, advantages.keep, strict=True):
            if not kept:
                sample.discarded = "zero_variance"
        batch = build_update_batch(
            rollouts.trained, advantages, recomputed, reuse=self.reuses_batch
        )
        update = self.update(batch, algorithm)
        train_s = time.perf_counter() - started  # the metric: recompute and update
        self.timeline.mark("train", updating, started + train_s)
        self.step += 1
        started = time.perf_counter()
        sync_s = self.sync_weights()
        self.timeline.mark("weight_sync", started, started + sync_s)
        return self.record_step(rollouts, advantages, update, train_s=train_s, sync_s=sync_s)

    @property
    def reuses_batch(self) -> bool:
        """The step's batch serves more than one optimiser step (off-policy after the first)."""
        return self.spec.batch.epochs * self.spec.batch.mini_batches > 1

    # -------------------------------------------------------------- recompute

    def recompute(self, samples: list[Sample], algorithm: AlgorithmConfig) -> Recomputed:
        """The forward-only passes the step needs over the samples to train on. Each runs once
        per step on every rank (under ZeRO-3 they are collectives); the rows take their
        slices."""
        has_reference = self.trainer.reference_model is not None
        ref = (
            per_sample_tokens(samples, lambda rows: self.trainer.logprobs(rows, reference=True))
            if has_reference
            else None
        )
        kl_in_reward = algorithm.kl_in_reward and has_reference and self.kl_coef > 0
        old = (
            per_sample_tokens(samples, self.trainer.logprobs)
            if self.reuses_batch or kl_in_reward
            else None
        )
        values = (
            per_sample_tokens(samples, self.trainer.values)
            if self.trainer.has_value_head and samples
            else None
        )
        return Recomputed(ref_logprobs=ref, old_logprobs=old, values=values)

    # -------------------------------------------------------------- update

    def update(self, batch: UpdateBatch, algorithm: AlgorithmConfig) -> UpdateResult:
        """``epochs`` x ``mini_batches`` optimiser steps over the rows (a mini-batch takes every
        ``mini_batches``-th row), at this step's learning rate."""
        result = UpdateResult()
        parts = self.spec.batch.mini_batches
        self.trainer.set_lr(self.learning_rate())
        for _ in range(self.spec.batch.epochs):
            for part in range(parts):
                chosen = list(range(part, len(batch.rows), parts))
                result.add(
                    self.trainer.train_step(
                        [batch.rows[i] for i in chosen],
                        algorithm,
                        kl_coef=self.kl_coef,
                        ref_logprobs=(
                            [batch.ref_logprobs[i] for i in chosen]
                            if batch.ref_logprobs is not None
                            else None
                        ),
                    )
                )
        if result.skipped:
            self.sink.event(
                "train.skipped",
                {
                    "step": self.step + 1,
                    "reason": "no training rows: every group was dropped (equal rewards) "
                    "or nothing was generated",
                },
            )
        return result

    # -------------------------------------------------------------- record

    def record_step(
        self,
        rollouts: Rollouts,
        advantages: Advantages,
        update: UpdateResult,
        *,
        train_s: float,
        sync_s: float,
    ) -> dict[str, float]:
        """The record stage: the step's metrics (every rank's samples), its trajectories, its
        timeline and the collapse detector's verdict to the sink (rank 0's)."""
        timings = {
            "timing_s/rollout": rollouts.rollout_s,
            "timing_s/tools": rollouts.tools_s,
            "timing_s/reward": rollouts.reward_s,
            "timing_s/train": train_s,
            "timing_s/weight_sync": sync_s,
            "timing_s/step": time.perf_counter() - self.timeline.started,
        }
        records = _gather([self.sample_record(s) for s in rollouts.samples], self.world)
        trajectories = _gather([self.trajectory(s) for s in rollouts.samples], self.world)
        metrics = sample_metrics(records)
        metrics.update(update.metrics())
        metrics.update(advantages.metrics)
        metrics.update(rollouts.metrics)
        if trajectories:
            metrics["batch/discarded_fraction"] = sum(
                1 for t in trajectories if t["discarded"]
            ) / len(trajectories)
        metrics.update(timings)
        metrics["perf/throughput"] = metrics["perf/num_tokens"] / max(
            timings["timing_s/step"], 1e-9
        )
        response_tokens = sum(r.response_length for r in records)
        metrics["perf/rollout_tokens_per_s"] = response_tokens / max(
            timings["timing_s/rollout"], 1e-9
        )
        metrics["perf/cpu_threads"] = float(torch.get_num_threads())
        metrics["policy_version"] = float(self.step)
        metrics["kl_coef"] = float(self.kl_coef)
        metrics["sampling/temperature"] = float(self.temperature)
        weight_sum = sum(w for w in self.weights.values() if w > 0)
        for name in self.weights:
            metrics[f"mix/{name}/weight"] = max(self.weights[name], 0.0) / weight_sum
            metrics[f"mix/{name}/prompts"] = float(sum(1 for d, _ in rollouts.drawn if d == name))
        self.sink.trajectories(trajectories)
        self.sink.metrics(self.step, metrics)
        self.step_s = timings["timing_s/step"]
        change = self.collapse.observe(self.step, metrics)
        if change is not None:
            self.sink.event(*change)
        return metrics

    def end_step(self) -> None:
        """Sends the step's timeline, every rank's spans (after the step's checkpoint, whose
        span it includes: ``step_s`` is the step without it, as ``timing_s/step``)."""
        timeline = _gather(self.timeline.spans, self.world)
        self.sink.event(
            "step.timeline",
            {"step": self.step, "step_s": round(self.step_s, 6), "stages": timeline},
        )

    # -------------------------------------------------------------- rollout (with reward)

    def rollout_and_score(self) -> Rollouts:
        """The rollout stage: draw, roll out and score this step's prompts; with
        ``max_generation_rounds`` > 1 (DAPO's dynamic sampling), keep drawing until
        ``prompts_per_step`` groups have rewards that differ."""
        spec = self.spec
        per_round = spec.batch.prompts_per_step
        rounds_allowed = spec.batch.max_generation_rounds
        dynamic = rounds_allowed > 1
        samples: list[Sample] = []
        drawn: list[tuple[str, dict[str, Any]]] = []
        rollout_s = tools_s = reward_s = 0.0
        rounds = 0
        varied_groups: list[int] = []
        varied_total = 0  # over every rank
        while True:
            batch = self.sampler.draw(self.weights, per_round)
            offset = len(drawn)  # group ids stay unique across rounds
            drawn.extend(batch)
            mine = [
                (offset + g, *batch[g]) for g in shard_groups(len(batch), self.rank, self.world)
            ]
            # Round 0 keeps the seed a run without dynamic sampling uses (resume tests pin it).
            seed = _seed_for(spec.seed, self.step, self.rank, *([rounds] if rounds else []))
            t = time.perf_counter()
            self.tool_seconds = 0.0
            fresh = self.rollout(mine, spec.batch.group_size, self.temperature, seed)
            # Tool phases run inside the rollout (episodes interleave generation and tools);
            # their elapsed time is split out, so rollout + tools is the stage's wall time.
            ended = time.perf_counter()
            rollout_s += ended - t - self.tool_seconds
            tools_s += self.tool_seconds
            # On the timeline the tool calls are interleaved with generation: both stages span
            # the round's wall time, each with its own busy seconds.
            self.timeline.mark(
                "rollout", t, ended, busy_s=ended - t - self.tool_seconds, round=rounds
            )
            if self.tool_seconds > 0:
                self.timeline.mark("tools", t, ended, busy_s=self.tool_seconds, round=rounds)
            t = time.perf_counter()
            self.score(fresh)
            ended = time.perf_counter()
            reward_s += ended - t
            self.timeline.mark("reward", t, ended, round=rounds)
            samples.extend(fresh)
            rounds += 1
            if not dynamic:
                break
            varied_groups = _varied_groups(samples)
            # Every rank must take the same decision (the next round is a collective).
            varied_total = sum(_gather([len(varied_groups)], self.world))
            if varied_total >= per_round or rounds >= rounds_allowed:
                break
        if not dynamic:
            return Rollouts(samples, samples, drawn, {}, rollout_s, tools_s, reward_s)
        # This rank's share of the batch: as many groups as its shard of one round.
        share = len(shard_groups(per_round, self.rank, self.world))
        chosen = set(varied_groups[:share])
        trained = [s for s in samples if s.group in chosen]
        varied = set(varied_groups)
        for s in samples:
            if s.group not in chosen:
                # Drawn but not trained on: flat rewards, or more varied groups than the batch
                # holds (the surplus of the last round).
                s.discarded = "batch_full" if s.group in varied else "zero_variance"
        generation = {
            "batch/generation_rounds": float(rounds),
            "batch/varied_groups": float(varied_total),
        }
        if varied_total < per_round:
            self.sink.event(
                "batch.short",
                {
                    "step": self.step + 1,
                    "rounds": rounds,
                    "varied_groups": generation["batch/varied_groups"],
                    "wanted": per_round,
                },
            )
        return Rollouts(samples, trained, drawn, generation, rollout_s, tools_s, reward_s)

    def learning_rate(self) -> float:
        """This step's learning rate: ``lr``, ramped linearly over ``lr_warmup_steps``."""
        warmup = self.spec.lr_warmup_steps
        if warmup <= 0:
            return self.spec.lr
        return self.spec.lr * min(1.0, (self.step + 1) / warmup)

    def trajectory(self, s: Sample) -> dict[str, Any]:
        """The sample as a `training.trajectory.Trajectory`, in the dict form sinks receive.
        Built through `Trajectory.from_dict` so that what reaches a sink is checked against the
        one definition (a drifted key fails here, in tests, not in a consumer)."""
        from training.trajectory import Trajectory

        asked = s.task.get("messages") or [
            {
                "role": "user",
                "content": s.task.get("metadata", {}).get("question", s.task["prompt"]),
            }
        ]
        messages = s.messages or [*asked, {"role": "assistant", "content": s.text}]
        return Trajectory.from_dict(
            {
                "messages": messages,
                "prompt": s.task["prompt"],
                "completion": s.text,
                "observations": s.observations,
                "reward": {"total": s.reward, "breakdown": s.breakdown, "details": s.details},
                "finish_reason": s.finish_reason,
                "discarded": s.discarded,
                "response_tokens": len(s.response_ids),
                "task_id": s.task.get("metadata", {}).get("task_id"),
                "provenance": {
                    "run": self.spec.name,
                    "step": self.step,
                    "policy_version": s.policy_version,
                    "domain": s.domain,
                    "group": s.group,
                    "rubric_digest": self.rubric_digests[s.domain],
                    "rubric_version": self.domains[s.domain].rubric_version,
                    "sandbox_image": s.sandbox_image or self.domains[s.domain].sandbox_image,
                },
            }
        ).to_dict()

    # -------------------------------------------------------------- evaluation

    def evaluate(self) -> dict[str, float]:
        tasks = [
            (name, task)
            for name, items in self.eval_tasks.items()
            for task in items[: self.spec.eval.tasks_per_domain]
        ]
        if not tasks:
            return {}
        mine = [(g, *tasks[g]) for g in shard_groups(len(tasks), self.rank, self.world)]
        temperature = 0.0 if self.spec.eval.greedy else self.temperature
        samples = self.rollout(mine, 1, temperature, _seed_for(self.spec.seed, -7, self.rank))
        self.score(samples)
        metrics = eval_metrics(_gather([self.sample_record(s) for s in samples], self.world))
        self.eval_history.append((self.step, metrics))
        self.sink.metrics(self.step, metrics)
        return metrics

    def close(self) -> None:
        for rubric in self.rubrics.values():
            rubric.close()
        self.engine.close()


def _varied_groups(samples: Sequence[Sample]) -> list[int]:
    """The groups (in order of first appearance) whose rewards are not all equal (the same
    test the update applies: `filter_zero_variance_groups`, tolerance 1e-6)."""
    from training.algorithms import filter_zero_variance_groups

    if not samples:
        return []
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    keep = filter_zero_variance_groups(rewards, [s.group for s in samples], tolerance=1e-6)
    return list(
        dict.fromkeys(s.group for s, kept in zip(samples, keep.tolist(), strict=True) if kept)
    )


def _parameter_digest(weights: torch.nn.Module | Any) -> str:
    """A cheap fingerprint of the weights (per-tensor float64 sums, hashed): data-parallel
    ranks must end every step with identical weights, and this shows whether they did.
    Takes a module or ``(name, tensor)`` pairs (`Trainer.named_tensors`, full even under
    ZeRO-3)."""
    if isinstance(weights, torch.nn.Module):
        weights = weights.state_dict().items()
    sums = [float(t.detach().double().sum()) for _, t in sorted(weights, key=lambda nt: nt[0])]
    return hashlib.sha256(np.asarray(sums, dtype=np.float64).tobytes()).hexdigest()[:16]


def _resolve_model(base_model: str) -> Path:
    if base_model in ("demo", "demo:test"):
        from training.models import ensure_demo_model

        return ensure_demo_model()
    path = Path(base_model)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"base_model {base_model!r} is not a model directory")
    return path


def run(spec: RunSpec, sink: Sink, control: Control) -> RunOutcome:
    """Runs ``spec`` to completion, preemption, cancellation or failure (never raises for a
    failure inside the run: the outcome says ``failed`` with the error, and the sink got a
    ``run.failed`` event with the traceback)."""
    queued = sink if isinstance(sink, QueueingSink) else QueueingSink(sink, close_inner=False)
    state: _Run | None = None
    outcome: RunOutcome
    threads_before = torch.get_num_threads()
    try:
        if spec.cpu_threads:
            # Several jobs on one CPU host: more threads than the job's share of the cores make
            # OpenMP spin-wait against the others (a demo-model step measured 11 s at 2 threads
            # beside another process, 0.8 s at 1).
            set_cpu_threads(spec.cpu_threads)
        state = _Run(spec, queued, control)
        state.maybe_resume()
        state.sink.event(
            "run.started",
            {
                "run": spec.name,
                "step": state.step,
                "world_size": state.world,
                "spec": spec.to_dict() if state.step == 0 else None,
            },
        )
        if spec.eval.at_start and state.step == 0:
            state.evaluate()
        last: dict[str, float] = {}
        while state.step < spec.max_steps:
            decision = _broadcast_from_rank0(
                control.poll(state.step) if state.rank == 0 else None, state.rank, state.world
            )
            assert isinstance(decision, ControlDecision)
            if decision.cancel:
                state.sink.event("run.cancelled", {"step": state.step, "reason": decision.reason})
                outcome = RunOutcome("cancelled", state.step, state.last_checkpoint)
                break
            if decision.preempt:
                path = state.save("preempt")
                state.sink.event(
                    "run.preempted",
                    {"step": state.step, "checkpoint": path, "reason": decision.reason},
                )
                outcome = RunOutcome("preempted", state.step, path)
                break
            state.apply_overrides(decision.overrides)
            last = state.train_step()
            every = spec.checkpoint.every_steps
            if every and state.step % every == 0 and state.step < spec.max_steps:
                saving = time.perf_counter()
                state.save("periodic")
                state.timeline.mark("checkpoint", saving, time.perf_counter())
            state.end_step()
            if spec.eval.every_steps and state.step % spec.eval.every_steps == 0:
                state.evaluate()
        else:
            if spec.eval.at_end and not (
                spec.eval.every_steps and state.step % spec.eval.every_steps == 0
            ):
                state.evaluate()
            path = state.save("final") if spec.checkpoint.save_final else state.last_checkpoint
            digests = _gather([_parameter_digest(state.trainer.named_tensors())], state.world)
            state.sink.event(
                "run.completed",
                {
                    "step": state.step,
                    "parameter_digests": digests,
                    "ranks_agree": len(set(digests)) == 1,
                },
            )
            outcome = RunOutcome("completed", state.step, path)
        outcome.final_metrics = last
        outcome.eval_history = list(state.eval_history)
    except Exception as exc:  # the job reports a failure; the console decides what next
        error = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(Exception):  # the sink itself may be what failed
            queued.event("run.failed", {"error": error, "traceback": traceback.format_exc()})
        step = state.step if state is not None else 0
        outcome = RunOutcome("failed", step, state.last_checkpoint if state else None, error)
        if state is not None:
            outcome.eval_history = list(state.eval_history)
    finally:
        if state is not None:
            with contextlib.suppress(Exception):
                state.close()
        set_cpu_threads(threads_before)
    if queued is not sink:
        try:
            queued.close()
        except Exception as exc:
            if outcome.status != "failed":
                outcome.error = f"sink: {exc}"
    return outcome
