"""Multi-turn tool use: the policy calls tools, a sandbox runs them, observations go back in.

An *episode* starts from a task (``{"prompt", "ground_truth", "metadata"}``, as the demo
domains make them) and alternates:

1. the rollout engine samples one assistant turn from the context so far;
2. tool calls in that turn (the text protocol of ``training.demo.chat``: a
   ``<tool>python ... </tool>`` or ``<tool>shell ... </tool>`` block) run in the episode's own
   sandbox (``sandboxes``): ``python`` writes the body to ``main.py`` and runs it with
   ``python3``, ``shell`` runs ``sh -c BODY``. Files and the working directory persist across
   the turns of one episode;
3. each observation (stdout, stderr, exit code; see ``format_observation``) is appended as a
   ``tool`` turn, and the assistant continues.

A turn without a tool call is the final answer. Limits: ``max_turns`` assistant turns, a token
budget for the whole context (``max_total_tokens``: prompt, generations and observations), a
per-turn ``max_new_tokens``, a per-call timeout and an observation length cap. An episode that
hits a limit ends with that reason; a sandbox that fails to start ends *that* episode with
``finish_reason="error"`` and the message, never the batch.

Episodes are batched: every active episode's next turn is one ``engine.generate`` call, and the
tool calls of a turn run in parallel threads. At most ``SandboxPool.max_active`` episodes are
active at once, because an episode holds its sandbox until it ends; the rest wait their turn
(first come, first served), so a pool smaller than the batch cannot deadlock.

The result, an :class:`Episode` per task sample, is OpenAI-style ``messages`` (assistant turns
with ``tool_calls``, ``tool`` messages with ``tool_call_id``), the per-step engine outputs
(token ids, log-probabilities, policy version: the provenance the trainer needs), per-call
observations and the sandbox image digest.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from sandboxes import SandboxError, SandboxPool, SandboxSpec
from training.demo.chat import END, ROLE_TOKENS, ToolCall, format_observation, parse_tool_calls
from training.demo.chat import render_turn as render_demo_turn
from training.rollout.base import RolloutEngine, RolloutOutput, SamplingConfig

EpisodeEnd = Literal["answer", "max_turns", "max_tokens", "length", "error"]
KNOWN_TOOLS = ("python", "shell")


@dataclass(frozen=True)
class AgentConfig:
    """Limits of an episode and the sandbox its tools run in."""

    max_turns: int = 4
    max_total_tokens: int = 512
    max_new_tokens_per_turn: int = 96
    tool_timeout_s: float = 5.0
    observation_max_chars: int = 1000
    tools: tuple[str, ...] = KNOWN_TOOLS
    sandbox: SandboxSpec = field(
        default_factory=lambda: SandboxSpec(memory_mb=256, pids=32, disk_mb=64, timeout_s=10)
    )

    def __post_init__(self) -> None:
        problems = []
        for name in (
            "max_turns",
            "max_total_tokens",
            "max_new_tokens_per_turn",
            "observation_max_chars",
        ):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be ≥ 1")
        if self.tool_timeout_s <= 0:
            problems.append("tool_timeout_s must be > 0")
        unknown = sorted(set(self.tools) - set(KNOWN_TOOLS))
        if unknown:
            problems.append(f"tools {unknown} are unknown; known: {list(KNOWN_TOOLS)}")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass
class Observation:
    """What one tool call produced."""

    call_id: str
    tool: str
    code: str
    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool = False
    oom_killed: bool = False
    truncated: bool = False
    wall_s: float = 0.0
    error: str = ""


@dataclass
class Step:
    """One assistant turn: the engine's output and the tool calls it made."""

    turn: int
    output: RolloutOutput
    tool_calls: list[dict[str, Any]]
    observations: list[Observation]


@dataclass
class TokenSequence:
    """An episode's tokens for training: see :meth:`Episode.token_sequence`."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    logprobs: list[float]
    consistent: bool


@dataclass
class Episode:
    """One multi-turn agent episode in memory: messages, per-turn engine outputs and tool
    observations. The loop turns it into a `training.trajectory.Trajectory` (the reported,
    JSON form) once it is scored."""

    task_id: str
    domain: str
    prompt: str
    ground_truth: Any
    metadata: dict[str, Any]
    messages: list[dict[str, Any]]
    steps: list[Step] = field(default_factory=list)
    finish_reason: EpisodeEnd = "answer"
    error: str = ""
    sandbox_image: str | None = None
    group_index: int = 0
    wall_s: float = 0.0

    @property
    def completion(self) -> str:
        """The final assistant turn's text: what a rubric scores."""
        for message in reversed(self.messages):
            if message["role"] == "assistant":
                return str(message.get("content") or "")
        return ""

    def token_sequence(self) -> TokenSequence:
        """The whole episode as one sequence for the trainer, tool turns masked out.

        ``prompt_ids`` is the first turn's prompt; ``response_ids`` runs from there to the end
        of the last assistant turn, with ``response_mask`` 1 on tokens the policy sampled (their
        ``logprobs`` are the engine's) and 0 on tokens the environment inserted (the end of a
        tool-calling turn, the tool turns, the assistant cue; their logprobs are 0). Each turn's
        prompt is the previous turn's prompt and output plus those inserted tokens — checked
        here, since a tokenizer could merge across the boundary; when it does not hold the
        result says so (``consistent=False``) and holds the turns concatenated instead.
        """
        if not self.steps:
            return TokenSequence([], [], [], [], True)
        first = self.steps[0].output
        response: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        consistent = True
        context = list(first.prompt_token_ids)
        for index, step in enumerate(self.steps):
            output = step.output
            if index > 0:
                prompt = list(output.prompt_token_ids)
                if prompt[: len(context)] != context:
                    consistent = False
                inserted = prompt[len(context) :] if consistent else []
                response += inserted
                mask += [0] * len(inserted)
                logprobs += [0.0] * len(inserted)
                context = prompt if consistent else context
            response += output.token_ids
            mask += [1] * len(output.token_ids)
            logprobs += output.logprobs
            context = context + list(output.token_ids)
        return TokenSequence(list(first.prompt_token_ids), response, mask, logprobs, consistent)

    @property
    def policy_versions(self) -> list[int]:
        return sorted({step.output.policy_version for step in self.steps})

    @property
    def num_tool_calls(self) -> int:
        return sum(len(step.tool_calls) for step in self.steps)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["completion"] = self.completion
        data["policy_versions"] = self.policy_versions
        return data


class DemoChatFormat:
    """How an episode's context grows in the demo chat format (``training.demo.chat``)."""

    def after_assistant_turn(self, turn_text: str) -> str:
        return turn_text + END + "\n"

    def tool_turn(self, observation_text: str) -> str:
        return render_demo_turn("tool", observation_text)

    def assistant_cue(self) -> str:
        return ROLE_TOKENS["assistant"] + "\n"


@dataclass
class _EpisodeInProgress:
    """An `Episode` being played: its sandbox, the text context and calls still to run."""

    result: Episode
    context: str
    sandbox_cm: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    sandbox: Any = None
    pending_calls: list[tuple[str, ToolCall]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    done: bool = False


def _count_tokens(engine: RolloutEngine, text: str) -> int | None:
    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is None:
        return None
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def run_episodes(
    engine: RolloutEngine,
    tasks: Sequence[dict[str, Any]],
    sampling: SamplingConfig,
    config: AgentConfig | None = None,
    pool: SandboxPool | None = None,
    chat_format: DemoChatFormat | None = None,
    on_episode: Callable[[Episode], None] | None = None,
    timings: dict[str, float] | None = None,
) -> list[Episode]:
    """Run ``sampling.n`` episodes per task; trajectories come back in task order.

    ``on_episode`` is called as each episode finishes (for streaming to a sink).
    ``timings["tools_s"]`` (when given) is increased by the elapsed time of the tool phases,
    sandbox starts included. Tools of different episodes run at the same time, so this is
    less than the sum of the calls' own ``wall_s``.
    """
    config = config or AgentConfig()
    chat_format = chat_format or DemoChatFormat()
    own_pool = pool is None
    pool = pool or SandboxPool()
    per_turn = replace(sampling, n=1)
    episodes = [
        _EpisodeInProgress(result=_new_episode(task, group), context=task["prompt"])
        for task in tasks
        for group in range(sampling.n)
    ]
    waiting = list(episodes)
    active: list[_EpisodeInProgress] = []
    turn_index = 0
    try:
        with ThreadPoolExecutor(max_workers=max(1, pool.max_active)) as executor:
            while waiting or active:
                while waiting and len(active) < pool.max_active:
                    active.append(waiting.pop(0))
                tools_s = _advance(
                    engine, active, per_turn, config, pool, chat_format, executor, turn_index
                )
                if timings is not None:
                    timings["tools_s"] = timings.get("tools_s", 0.0) + tools_s
                turn_index += 1
                for episode in [e for e in active if e.done]:
                    episode.sandbox_cm.close()
                    episode.result.wall_s = round(time.monotonic() - episode.started, 3)
                    if on_episode is not None:
                        on_episode(episode.result)
                active = [e for e in active if not e.done]
    finally:
        for episode in episodes:
            episode.sandbox_cm.close()
        if own_pool:
            pool.close()
    return [episode.result for episode in episodes]


def _new_episode(task: dict[str, Any], group: int) -> Episode:
    metadata = dict(task.get("metadata") or {})
    question = metadata.get("question", task["prompt"])
    messages = list(task.get("messages") or [{"role": "user", "content": question}])
    return Episode(
        task_id=str(metadata.get("task_id", "")),
        domain=str(metadata.get("domain", "")),
        prompt=task["prompt"],
        ground_truth=task.get("ground_truth"),
        metadata=metadata,
        messages=messages,
        group_index=group,
    )


def _advance(
    engine: RolloutEngine,
    active: list[_EpisodeInProgress],
    sampling: SamplingConfig,
    config: AgentConfig,
    pool: SandboxPool,
    chat_format: DemoChatFormat,
    executor: ThreadPoolExecutor,
    turn_index: int,
) -> float:
    """One assistant turn for every active episode, then their tool calls in parallel.
    Returns the seconds the tool phase took."""
    runnable: list[tuple[_EpisodeInProgress, int]] = []
    for episode in active:
        result = episode.result
        max_turns = min(config.max_turns, int(result.metadata.get("max_turns", config.max_turns)))
        if len(result.steps) >= max_turns:
            _finish(episode, "max_turns")
            continue
        used = _count_tokens(engine, episode.context)
        remaining = config.max_total_tokens - used if used is not None else config.max_total_tokens
        budget = min(config.max_new_tokens_per_turn, sampling.max_new_tokens, remaining)
        if budget < 1:
            _finish(episode, "max_tokens")
            continue
        runnable.append((episode, budget))
    if not runnable:
        return 0.0
    # One generate call per distinct budget keeps the batch large in the common case (all equal).
    by_budget: dict[int, list[_EpisodeInProgress]] = {}
    for episode, budget in runnable:
        by_budget.setdefault(budget, []).append(episode)
    for budget, group in by_budget.items():
        seed = None if sampling.seed is None else sampling.seed + 7919 * turn_index
        outputs = engine.generate(
            [e.context for e in group], replace(sampling, max_new_tokens=budget, seed=seed)
        )
        for episode, samples in zip(group, outputs, strict=True):
            _take_turn(episode, samples[0], chat_format)
    pending = [e for e, _ in runnable if not e.done]
    started = time.monotonic()
    results = list(executor.map(lambda e: _run_tools(e, config, pool), pending))
    tools_s = time.monotonic() - started if pending else 0.0
    for episode, observation_texts in zip(pending, results, strict=True):
        if episode.done:
            continue
        context = episode.context
        for text in observation_texts:
            context += chat_format.tool_turn(text)
        episode.context = context + chat_format.assistant_cue()
    return tools_s


def _take_turn(
    episode: _EpisodeInProgress, output: RolloutOutput, chat_format: DemoChatFormat
) -> None:
    result = episode.result
    prose, calls = parse_tool_calls(output.text)
    turn = len(result.steps)
    call_ids = [f"call_{turn}_{i}" for i in range(len(calls))]
    tool_calls = [call.to_openai(call_id) for call, call_id in zip(calls, call_ids, strict=True)]
    message: dict[str, Any] = {"role": "assistant", "content": prose if calls else output.text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    result.messages.append(message)
    result.steps.append(Step(turn=turn, output=output, tool_calls=tool_calls, observations=[]))
    if calls:
        # The context keeps the model's own text, so the next turn conditions on what it wrote.
        episode.context += chat_format.after_assistant_turn(output.text)
        episode.pending_calls = list(zip(call_ids, calls, strict=True))
    elif output.finish_reason == "length":
        _finish(episode, "length")
    else:
        _finish(episode, "answer")


def _run_tools(episode: _EpisodeInProgress, config: AgentConfig, pool: SandboxPool) -> list[str]:
    calls, episode.pending_calls = episode.pending_calls, []
    step = episode.result.steps[-1]
    texts = []
    for call_id, call in calls:
        observation = _execute(episode, call_id, call, config, pool)
        if episode.done:  # the sandbox could not start
            return []
        step.observations.append(observation)
        text = format_observation(
            observation.stdout, observation.stderr, observation.exit_code, _note(observation)
        )
        if len(text) > config.observation_max_chars:
            text = text[: config.observation_max_chars] + "\n[observation truncated]"
        episode.result.messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
        texts.append(text)
    return texts


def _note(observation: Observation) -> str:
    if observation.error:
        return observation.error
    if observation.timed_out:
        return "timed out"
    if observation.oom_killed:
        return "out of memory"
    if observation.truncated:
        return "output truncated"
    return ""


def _execute(
    episode: _EpisodeInProgress,
    call_id: str,
    call: ToolCall,
    config: AgentConfig,
    pool: SandboxPool,
) -> Observation:
    if call.name not in config.tools:
        return Observation(
            call_id=call_id,
            tool=call.name,
            code=call.code,
            stdout="",
            stderr="",
            exit_code=None,
            error=f"unknown tool {call.name!r}; tools: {', '.join(config.tools)}",
        )
    if episode.sandbox is None:
        try:
            episode.sandbox = episode.sandbox_cm.enter_context(pool.acquire(config.sandbox))
            episode.result.sandbox_image = episode.sandbox.image_digest
        except (SandboxError, OSError) as error:
            _finish(episode, "error", f"sandbox failed to start: {error}")
            return Observation(call_id, call.name, call.code, "", "", None, error=str(error))
    sandbox = episode.sandbox
    try:
        if call.name == "python":
            sandbox.write_files({"main.py": call.code})
            result = sandbox.run(["python3", "main.py"], timeout=config.tool_timeout_s)
        else:
            result = sandbox.run(["sh", "-c", call.code], timeout=config.tool_timeout_s)
    except SandboxError as error:
        return Observation(
            call_id, call.name, call.code, "", "", None, error=f"sandbox error: {error}"
        )
    return Observation(
        call_id=call_id,
        tool=call.name,
        code=call.code,
        stdout=result.stdout,
        stderr=result.stderr,
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        oom_killed=result.oom_killed,
        truncated=result.truncated,
        wall_s=result.wall_s,
    )


def _finish(episode: _EpisodeInProgress, reason: EpisodeEnd, error: str = "") -> None:
    episode.done = True
    episode.result.finish_reason = reason
    episode.result.error = error
