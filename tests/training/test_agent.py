"""Multi-turn tool use with real sandboxes. The control flow is pinned with a scripted policy
(a fake of the model only); the demo model then runs real episodes through the HF engine."""

import json
import re
import time

import pytest

from sandboxes import SandboxPool, SandboxSpec
from tests.training.rollout_fixtures import demo_model_dir  # noqa: F401
from training.agent import AgentConfig, run_episodes
from training.demo import get_domain, user_prompt
from training.rollout import RolloutOutput, SamplingConfig
from training.rollout.hf import HFEngine


class ScriptedPolicy:
    """Answers each context with the next line of a script chosen by the task's question.

    ``script(context) -> text`` sees the whole context, so a script can react to observations.
    """

    tokenizer = None

    def __init__(self, script):
        self.script = script
        self.policy_version = 5
        self.calls = []

    def generate(self, prompts, sampling):
        self.calls.append((list(prompts), sampling))
        results = []
        for prompt in prompts:
            text = self.script(prompt)
            results.append(
                [
                    RolloutOutput(
                        prompt=prompt,
                        prompt_token_ids=[1] * len(prompt),
                        text=text,
                        token_ids=[2] * len(text),
                        logprobs=[-0.1] * len(text),
                        finish_reason="stop",
                        policy_version=self.policy_version,
                    )
                ]
            )
        return results

    def update_weights(self, named_tensors, version):
        self.policy_version = version

    def close(self):
        pass


def _task(question, **metadata):
    return {
        "prompt": user_prompt(question),
        "ground_truth": None,
        "metadata": {"question": question, "task_id": question, "domain": "t", **metadata},
    }


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(max_active=2) as pool:
        yield pool


FAST = AgentConfig(tool_timeout_s=3, sandbox=SandboxSpec(memory_mb=128, timeout_s=5))


def test_a_tool_call_runs_in_the_sandbox_and_its_output_comes_back(pool):
    def script(context):
        if "<|tool|>" not in context:
            return "Let me compute.<tool>python\nprint(37 * 48)\n</tool>"
        observed = re.findall(r"<\|tool\|>\n(.*?)<\|end\|>", context, re.S)[-1]
        return f"\\boxed{{{observed}}}"

    [episode] = run_episodes(
        ScriptedPolicy(script), [_task("37 * 48?")], SamplingConfig(), FAST, pool
    )
    assert episode.finish_reason == "answer"
    assert episode.completion == "\\boxed{1776}"
    user, call, tool, answer = episode.messages
    assert user == {"role": "user", "content": "37 * 48?"}
    assert call["content"] == "Let me compute."
    [tool_call] = call["tool_calls"]
    assert tool_call["function"]["name"] == "python"
    assert json.loads(tool_call["function"]["arguments"]) == {"code": "print(37 * 48)"}
    assert tool == {"role": "tool", "tool_call_id": tool_call["id"], "content": "1776"}
    assert answer == {"role": "assistant", "content": "\\boxed{1776}"}
    [observation] = episode.steps[0].observations
    assert (observation.stdout, observation.exit_code) == ("1776\n", 0)
    assert episode.policy_versions == [5]
    assert episode.sandbox_image is None  # the bare bwrap base, no image
    json.dumps(episode.to_dict())  # a sink can store it as is
    # The scripted policy's token ids do not line up turn to turn, and the sequence says so.
    assert not episode.token_sequence().consistent


def test_files_persist_across_turns_and_errors_are_observed(pool):
    turns = iter(
        [
            "<tool>shell\necho 41 > n.txt\n</tool>",
            "<tool>python\nprint(int(open('n.txt').read()) + 1)\nraise SystemExit(3)\n</tool>",
            "<tool>python\nundefined_name\n</tool>",
            "done",
        ]
    )
    [episode] = run_episodes(
        ScriptedPolicy(lambda _: next(turns)), [_task("q")], SamplingConfig(), FAST, pool
    )
    tool_messages = [m["content"] for m in episode.messages if m["role"] == "tool"]
    assert tool_messages[1] == "42\n[exit 3]"
    assert "NameError" in tool_messages[2] and tool_messages[2].endswith("[exit 1]")
    assert episode.finish_reason == "answer"


def test_hostile_tool_code_times_out_and_the_episode_goes_on(pool):
    turns = iter(["<tool>python\nwhile True: pass\n</tool>", "gave up"])
    config = AgentConfig(tool_timeout_s=1, sandbox=SandboxSpec(memory_mb=128, timeout_s=5))
    [episode] = run_episodes(
        ScriptedPolicy(lambda _: next(turns)), [_task("q")], SamplingConfig(), config, pool
    )
    [observation] = episode.steps[0].observations
    assert observation.timed_out
    assert episode.messages[2]["content"].endswith("[timed out]")
    assert episode.completion == "gave up"


def test_tool_time_is_the_elapsed_tool_phase_not_the_sum_of_parallel_calls(pool):
    # Two episodes each sleep 1 s in a tool, side by side: the calls' own times add up to
    # ~2 s inside a run that took ~1 s. Subtracting that sum from the rollout's wall time made
    # timing_s/rollout negative; the phase's elapsed time is what a stage timing means.
    def script(context):
        if "<|tool|>" not in context:
            return "<tool>python\nimport time; time.sleep(1)\n</tool>"
        return "done"

    timings = {}
    t = time.monotonic()
    episodes = run_episodes(
        ScriptedPolicy(script),
        [_task("a"), _task("b")],
        SamplingConfig(),
        FAST,
        pool,
        timings=timings,
    )
    elapsed = time.monotonic() - t
    calls = sum(o.wall_s for tr in episodes for step in tr.steps for o in step.observations)
    assert calls > elapsed  # the calls overlapped
    assert 1.0 <= timings["tools_s"] <= elapsed


def test_turn_limit_ends_an_episode_that_never_answers(pool):
    policy = ScriptedPolicy(lambda _: "<tool>shell\ntrue\n</tool>")
    [episode] = run_episodes(policy, [_task("q", max_turns=2)], SamplingConfig(), FAST, pool)
    assert episode.finish_reason == "max_turns"
    assert len(episode.steps) == 2


def test_unknown_tools_get_an_error_observation_without_a_sandbox(pool):
    turns = iter(["<tool>browser\nopen evil.example\n</tool>", "ok"])
    [episode] = run_episodes(
        ScriptedPolicy(lambda _: next(turns)), [_task("q")], SamplingConfig(), FAST, pool
    )
    assert episode.messages[2]["content"] == "[unknown tool 'browser'; tools: python, shell]"
    assert episode.sandbox_image is None


def test_episodes_are_batched_and_bounded_by_the_pool(pool):
    policy = ScriptedPolicy(
        lambda ctx: "fin" if "<|tool|>" in ctx else "<tool>shell\necho hi\n</tool>"
    )
    tasks = [_task(f"q{i}") for i in range(3)]
    episodes = run_episodes(policy, tasks, SamplingConfig(n=2), FAST, pool)
    assert [t.task_id for t in episodes] == ["q0", "q0", "q1", "q1", "q2", "q2"]
    assert [t.group_index for t in episodes] == [0, 1] * 3
    assert all(t.completion == "fin" and t.num_tool_calls == 1 for t in episodes)
    # Never more episodes in one generate call than the pool has sandboxes.
    assert max(len(prompts) for prompts, _ in policy.calls) == pool.max_active
    assert all(sampling.n == 1 for _, sampling in policy.calls)


def test_the_token_budget_ends_long_episodes(demo_model_dir, pool):  # noqa: F811
    engine = HFEngine(demo_model_dir)
    task = get_domain("tool_calc").make_tasks(1, seed=0, split="held_out")[0]
    prompt_tokens = len(engine.tokenizer(task["prompt"])["input_ids"])
    config = AgentConfig(max_total_tokens=prompt_tokens + 4, sandbox=FAST.sandbox)
    [episode] = run_episodes(engine, [task], SamplingConfig(temperature=0), config, pool)
    assert len(episode.steps[0].output.token_ids) <= 4
    assert episode.finish_reason in {"max_tokens", "length"}


def test_the_demo_model_calls_the_python_tool_and_answers(demo_model_dir, pool):  # noqa: F811
    engine = HFEngine(demo_model_dir)
    tasks = get_domain("tool_calc").make_tasks(4, seed=0, split="held_out")
    episodes = run_episodes(
        engine, tasks, SamplingConfig(temperature=0), AgentConfig(sandbox=FAST.sandbox), pool
    )
    for episode in episodes:
        first = episode.steps[0]
        assert first.tool_calls, episode.messages  # the warm-up taught it the protocol
        [observation] = first.observations
        # Whatever it multiplied, the sandbox really ran it.
        code = json.loads(first.tool_calls[0]["function"]["arguments"])["code"]
        product = re.fullmatch(r"print\((\d+) \* (\d+)\)", code)
        if product:
            assert observation.stdout == f"{int(product[1]) * int(product[2])}\n"
        assert episode.steps[-1].output.policy_version == 0


def test_a_multi_turn_episode_is_one_token_sequence_with_tool_turns_masked(
    demo_model_dir,  # noqa: F811
    pool,
):
    engine = HFEngine(demo_model_dir)
    tasks = get_domain("tool_calc").make_tasks(2, seed=1, split="held_out")
    episodes = run_episodes(
        engine, tasks, SamplingConfig(temperature=0), AgentConfig(sandbox=FAST.sandbox), pool
    )
    for episode in episodes:
        assert len(episode.steps) >= 2, episode.messages  # called the tool, then answered
        sequence = episode.token_sequence()
        assert sequence.consistent
        last = episode.steps[-1].output
        assert sequence.prompt_ids + sequence.response_ids == last.prompt_token_ids + last.token_ids
        assert len(sequence.response_mask) == len(sequence.response_ids) == len(sequence.logprobs)
        sampled = [
            t for t, m in zip(sequence.response_ids, sequence.response_mask, strict=True) if m
        ]
        assert sampled == [t for step in episode.steps for t in step.output.token_ids]
        inserted = engine.tokenizer.decode(
            [t for t, m in zip(sequence.response_ids, sequence.response_mask, strict=True) if not m]
        )
        assert "<|tool|>" in inserted and episode.messages[2]["content"] in inserted
