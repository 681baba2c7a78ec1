"""The run loop on the tiny model: exact resume, preemption, cancellation, live overrides,
domain mixing, trajectories with provenance, failures reported rather than raised."""

from __future__ import annotations

import math
import socket

import pytest

from tests.training.conftest import tiny_spec
from training.checkpoint import list_checkpoints
from training.control import StaticControl
from training.loop import DomainMixSampler, mix_counts, run
from training.sink import ListSink
from training.spec import RunSpec

# live overrides at step 1 (the second step): they must survive a preemption at step 2
OVERRIDES = {1: {"domain_weights": {"arith_b": 3.0}, "kl_coef": 0.05, "temperature": 0.9}}


def comparable(metrics):
    return {
        k: v
        for k, v in metrics.items()
        if not k.startswith(("timing_s/", "perf/throughput", "perf/rollout"))
    }


def assert_same_metrics(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if math.isnan(a[key]):
            assert math.isnan(b[key]), key
        else:
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-9), key


def completed_tiny_run(model_dir, tmp_path, **changes):
    """Runs ``tiny_spec`` with ``changes`` to completion; returns its sink."""
    sink = ListSink()
    outcome = run(
        RunSpec.from_dict(tiny_spec(model_dir, tmp_path, **changes)), sink, StaticControl()
    )
    assert outcome.status == "completed", outcome.error
    return sink


@pytest.mark.slow
def test_a_run_resumed_after_preemption_matches_an_uninterrupted_one(tiny_model_dir, tmp_path):
    straight_dir = tmp_path / "straight"
    spec = RunSpec.from_dict(
        tiny_spec(
            tiny_model_dir,
            straight_dir,
            max_steps=4,
            checkpoint={"dir": str(straight_dir / "ckpt"), "every_steps": 1, "keep_last": 2},
        )
    )
    straight = ListSink()
    outcome = run(spec, straight, StaticControl(overrides_at=OVERRIDES))
    assert outcome.status == "completed" and outcome.step == 4, outcome.error
    assert [p.name for p in list_checkpoints(straight_dir / "ckpt")] == [
        "step_00000003",
        "step_00000004",
    ]

    resumed_dir = tmp_path / "resumed"
    spec = RunSpec.from_dict(tiny_spec(tiny_model_dir, resumed_dir, max_steps=4))
    first = ListSink()
    preempted = run(spec, first, StaticControl(preempt_at=2, overrides_at=OVERRIDES))
    assert preempted.status == "preempted" and preempted.step == 2
    assert preempted.checkpoint and preempted.checkpoint.endswith("step_00000002")
    assert "run.preempted" in first.event_kinds()
    assert first.checkpoints[0]["reason"] == "preempt"

    second = ListSink()
    control = StaticControl()
    resumed = run(spec, second, control)  # resume: "latest" by default
    assert resumed.status == "completed" and resumed.step == 4
    assert control.polled == [2, 3]
    assert "run.resumed" in second.event_kinds()

    for step in (1, 2):
        assert_same_metrics(
            comparable(straight.metrics_at(step)), comparable(first.metrics_at(step))
        )
    for step in (3, 4):
        assert_same_metrics(
            comparable(straight.metrics_at(step)), comparable(second.metrics_at(step))
        )
    # the run learned something (non-zero gradients), so agreement is not trivially true
    assert straight.metrics_at(3)["actor/grad_norm"] > 0
    # the overrides were applied and carried over the preemption
    late = second.metrics_at(3)
    assert late["kl_coef"] == 0.05 and late["sampling/temperature"] == 0.9
    assert late["mix/arith_b/prompts"] == 3 and late["mix/arithmetic/prompts"] == 1
    kinds = straight.event_kinds()
    assert {"mix.weights_changed", "kl.coef_changed", "sampling.temperature_changed"} <= set(kinds)

    trajectory = straight.trajectory_items[-1]
    provenance = trajectory["provenance"]
    assert provenance["run"] == "tiny" and provenance["step"] == 4
    assert provenance["policy_version"] == 3  # sampled before the fourth update
    assert provenance["rubric_digest"].startswith("1:")
    assert provenance["rubric_version"] is None  # a CLI run: no registry version
    assert set(trajectory["reward"]["breakdown"]) == {"correct", "digit"}
    assert len(straight.trajectory_items) == 4 * 4 * 2  # steps x prompts x group size
    metrics = straight.metrics_at(2)
    for name in (
        "reward/arithmetic/mean",
        "reward/arith_b/digit/mean",
        "pass_rate",
        "response_length/clip_ratio",
        "actor/kl",
        "actor/entropy",
        "actor/pg_loss",
        "actor/pg_clipfrac",
        "actor/grad_norm",
        "actor/lr",
        "frac_reward_zero_std",
        "perf/throughput",
        "timing_s/rollout",
        "timing_s/tools",
        "timing_s/reward",
        "timing_s/train",
        "timing_s/weight_sync",
    ):
        assert name in metrics, name


def test_kl_in_the_reward_compares_the_trainers_log_probs_not_the_rollout_engines(
    tiny_model_dir, tmp_path
):
    # A bf16 rollout engine beside an fp32 trainer: at the first step the policy is the
    # reference, so the KL is zero; the engine's own log-probs read as a (k1) KL of -6.2e-5.
    sink = completed_tiny_run(
        tiny_model_dir,
        tmp_path,
        max_steps=1,
        algorithm={"algorithm": "reinforce_plus_plus"},
        kl={"coef": 0.1, "in_reward": True, "estimator": "k1"},
        rollout={"engine": "hf", "dtype": "bfloat16"},
    )
    assert abs(sink.metrics_at(1)["actor/reward_kl_penalty"]) < 1e-7  # engine's: -6.2e-5


def test_cancel_stops_before_the_step_without_a_checkpoint(tiny_model_dir, tmp_path):
    spec = RunSpec.from_dict(tiny_spec(tiny_model_dir, tmp_path, max_steps=3))
    sink = ListSink()
    outcome = run(spec, sink, StaticControl(cancel_at=1))
    assert outcome.status == "cancelled" and outcome.step == 1
    assert outcome.checkpoint is None and not sink.checkpoints
    assert sink.event_kinds()[-1] == "run.cancelled"


def test_a_failure_is_an_outcome_and_an_event_not_an_exception(tmp_path, tiny_model_dir):
    spec = RunSpec.from_dict(tiny_spec(tmp_path / "no-model", tmp_path))
    sink = ListSink()
    outcome = run(spec, sink, StaticControl())
    assert outcome.status == "failed" and "not a model directory" in outcome.error
    kind, data = sink.events[-1]
    assert kind == "run.failed" and "Traceback" in data["traceback"]


def test_mix_counts_are_proportional_and_exact_over_steps():
    counts, carry = mix_counts({"a": 1, "b": 1, "c": 1}, 4)
    assert sum(counts.values()) == 4 and sorted(counts.values()) == [1, 1, 2]
    totals = dict.fromkeys("abc", 0)
    carry = None
    for _ in range(30):
        counts, carry = mix_counts({"a": 1, "b": 1, "c": 1}, 4, carry)
        for name, count in counts.items():
            totals[name] += count
    assert totals == {"a": 40, "b": 40, "c": 40}
    counts, _ = mix_counts({"a": 3, "b": 1, "z": 0}, 8)
    assert counts == {"a": 6, "b": 2, "z": 0}


def test_the_sampler_resumes_from_its_state_and_covers_each_epoch():
    tasks = {"a": [{"prompt": f"a{i}"} for i in range(5)], "b": [{"prompt": "b"}]}
    sampler = DomainMixSampler(tasks, seed=1)
    first_epoch = [t["prompt"] for _, t in sampler.draw({"a": 1, "b": 0}, 5)]
    assert sorted(first_epoch) == [f"a{i}" for i in range(5)]
    state = sampler.state_dict()
    following = sampler.draw({"a": 1, "b": 1}, 4)
    again = DomainMixSampler(tasks, seed=1)
    again.load_state_dict(state)
    assert again.draw({"a": 1, "b": 1}, 4) == following


def test_ppo_trains_a_value_head_beside_the_policy(tiny_model_dir, tmp_path):
    sink = completed_tiny_run(
        tiny_model_dir,
        tmp_path,
        max_steps=2,
        algorithm={"algorithm": "ppo"},
        kl={"coef": 0.01},
        batch={"prompts_per_step": 2, "group_size": 2, "epochs": 2, "mini_batches": 2},
    )
    metrics = sink.metrics_at(2)
    assert metrics["critic/vf_loss"] > 0 and "critic/vpred_mean" in metrics
    assert "actor/reward_kl_penalty" in metrics  # PPO puts the KL in the reward
    saved = tmp_path / "ckpt" / "step_00000002" / "hf"
    assert (saved / "value_head").is_dir() and (saved / "config.json").is_file()


def tool_calc_spec(tasks: int, **fields):
    """A run on the demo model and the tool_calc domain, its tools run in host-python sandboxes."""
    from training.demo.domains import get_domain
    from training.models import ensure_demo_model

    tool_calc = get_domain("tool_calc")
    return RunSpec.from_dict(
        {
            "base_model": str(ensure_demo_model()),
            "lr": 1e-5,
            "batch": {"prompts_per_step": 2, "group_size": 2},
            "tools": {"enabled": True, "max_turns": 3, "max_total_tokens": 256},
            "domains": [
                {
                    "name": "tool_calc",
                    "rubric_spec": tool_calc.rubric_spec,
                    "tasks": tool_calc.make_tasks(tasks, seed=0),
                    "sandbox_image": "host-python",
                }
            ],
            "eval": {"at_start": False, "at_end": False},
            **fields,
        }
    )


@pytest.mark.slow
def test_tool_use_episodes_run_in_sandboxes_and_land_in_trajectories(tmp_path):
    spec = tool_calc_spec(
        4,
        name="tools",
        max_steps=1,
        sampling={"temperature": 0.7, "max_new_tokens": 32},
        checkpoint={"save_final": False, "resume": "none"},
    )
    sink = ListSink()
    outcome = run(spec, sink, StaticControl())
    assert outcome.status == "completed", outcome.error
    assert len(sink.trajectory_items) == 4
    with_tools = [t for t in sink.trajectory_items if t["observations"]]
    assert with_tools, "the demo model was warmed up to call the python tool"
    messages = with_tools[0]["messages"]
    assert any(m.get("tool_calls") for m in messages if m["role"] == "assistant")
    assert any(m["role"] == "tool" for m in messages)
    assert "exit_code" in with_tools[0]["observations"][0]
    assert sink.metrics_at(1)["timing_s/tools"] > 0


def test_multi_turn_episodes_are_scored_turn_by_turn_in_their_own_context():
    from training.step import Sample, per_sample_tokens

    def sample(prompt, response, turns=None):
        return Sample(
            domain="d",
            group=0,
            task={"prompt": "p"},
            prompt_ids=prompt,
            response_ids=response,
            logprobs=[0.0] * len(response),
            text="",
            finish_reason="stop",
            policy_version=0,
            turns=turns,
        )

    plain = sample([1, 2], [3, 4, 5])
    # two assistant turns; the second's context holds the first turn and a tool observation
    episode = sample(
        [1], [7, 8, 9], turns=[([1], [7, 8], [0.0, 0.0]), ([1, 7, 8, 40, 41], [9], [0.0])]
    )
    seen = []

    def context_length_plus_position(rows):
        seen.extend((r.prompt_ids, r.response_ids) for r in rows)
        return [[float(len(r.prompt_ids) + j) for j in range(len(r.response_ids))] for r in rows]

    scored = per_sample_tokens([plain, episode], context_length_plus_position)
    assert scored == [[2.0, 3.0, 4.0], [1.0, 2.0, 5.0]]
    assert ([1, 7, 8, 40, 41], [9]) in seen  # the observation tokens are in the context


@pytest.mark.slow
def test_ppo_with_kl_in_reward_trains_on_tool_use_episodes(tmp_path):
    """PPO's value head and the reference policy see each assistant turn in its own context
    (tool observations included). At the first step the policy is the reference, so the
    in-reward KL is near zero (measured 1e-9); when turns were scored against nothing
    (log-prob 0) it read 1.57."""
    spec = tool_calc_spec(
        8,
        name="tools-ppo",
        max_steps=2,
        algorithm={"algorithm": "ppo"},
        kl={"coef": 0.05, "estimator": "k3"},
        sampling={"temperature": 1.0, "max_new_tokens": 32},
        checkpoint={"dir": str(tmp_path / "ckpt"), "save_final": False, "resume": "none"},
    )
    sink = ListSink()
    outcome = run(spec, sink, StaticControl())
    assert outcome.status == "completed", outcome.error
    assert any(len(t["observations"]) > 0 for t in sink.trajectory_items)
    first = sink.metrics_at(1)
    assert first["critic/vf_loss"] > 0 and "critic/vpred_mean" in first
    assert 0 <= first["actor/reward_kl_penalty"] < 0.05
    assert math.isfinite(sink.metrics_at(2)["actor/pg_loss"])


@pytest.mark.slow
def test_zero3_with_cpu_offload_and_bf16_trains_checkpoints_whole_weights_and_resumes(
    tiny_model_dir, tmp_path
):
    from transformers import AutoModelForCausalLM

    deepspeed_config = {
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "cpu"},
            "offload_param": {"device": "cpu"},
        },
        "bf16": {"enabled": True},
        "gradient_clipping": 1.0,
    }
    spec = tiny_spec(tiny_model_dir, tmp_path, max_steps=2, deepspeed=deepspeed_config)
    first = run(RunSpec.from_dict(spec), ListSink(), StaticControl())
    assert first.status == "completed" and first.step == 2, first.error

    # The Hugging Face copy is whole (ZeRO-3 partitions would save empty tensors) and trained.
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    trained = AutoModelForCausalLM.from_pretrained(f"{first.checkpoint}/hf")
    base_params, trained_params = dict(base.named_parameters()), dict(trained.named_parameters())
    assert base_params.keys() == trained_params.keys()
    for name, tensor in base_params.items():
        assert trained_params[name].shape == tensor.shape, name
    assert any(not trained_params[n].float().equal(t.float()) for n, t in base_params.items())

    resumed_sink = ListSink()
    resumed = run(RunSpec.from_dict({**spec, "max_steps": 3}), resumed_sink, StaticControl())
    assert resumed.status == "completed" and resumed.step == 3, resumed.error
    assert "run.resumed" in resumed_sink.event_kinds()
    assert resumed_sink.metrics_at(3)["actor/grad_norm"] > 0


@pytest.mark.slow
def test_cpu_threads_hold_for_the_run_and_are_given_back(tiny_model_dir, tmp_path):
    import torch

    before = torch.get_num_threads()
    wanted = 1 if before != 1 else 2  # a value that differs from the process's own
    sink = ListSink()
    spec = RunSpec.from_dict(tiny_spec(tiny_model_dir, tmp_path, max_steps=1, cpu_threads=wanted))
    outcome = run(spec, sink, StaticControl())
    assert outcome.status == "completed", outcome.error
    assert sink.metrics_at(1)["perf/cpu_threads"] == wanted
    assert torch.get_num_threads() == before


def test_reward_mean_and_std_are_reported_per_domain_and_per_criterion():
    from training.metrics import SampleRecord, sample_metrics

    records = [
        SampleRecord("code", 0, 1.0, {"tests": 1.0, "format": 1.0}),
        SampleRecord("code", 0, 0.5, {"tests": 0.0, "format": 1.0}),
        SampleRecord("json", 1, 0.0, {"valid": 0.0}),
    ]
    metrics = sample_metrics(records)
    assert metrics["reward/code/mean"] == 0.75 and metrics["reward/code/std"] == 0.25
    assert metrics["reward/code/tests/mean"] == 0.5 and metrics["reward/code/tests/std"] == 0.5
    assert metrics["reward/code/format/std"] == 0.0
    assert metrics["reward/json/valid/mean"] == 0.0


def test_each_step_reports_its_stages_as_a_timeline_with_start_and_end(tiny_model_dir, tmp_path):
    # Temperature 0: every group is flat, so dynamic sampling runs all three rounds a step.
    base = tiny_spec(tiny_model_dir, tmp_path)
    sink = completed_tiny_run(
        tiny_model_dir,
        tmp_path,
        max_steps=2,
        algorithm={"algorithm": "dapo"},
        sampling={**base["sampling"], "temperature": 0.0},
        batch={**base["batch"], "max_generation_rounds": 3},
    )
    timelines = [p for kind, p in sink.events if kind == "step.timeline"]
    assert [p["step"] for p in timelines] == [1, 2]
    for payload in timelines:
        metrics = sink.metrics_at(payload["step"])
        stages = payload["stages"]
        assert [s["stage"] for s in stages] == [
            *["rollout", "reward"] * 3,
            "logprobs",  # the reference's log-probs (the spec's KL)
            "train",
            "weight_sync",
        ]
        assert [s["round"] for s in stages[:6]] == [0, 0, 1, 1, 2, 2]
        assert {s["rank"] for s in stages} == {0}
        # In order, not overlapping, inside the step.
        ends = [0.0]
        for span in stages:
            assert ends[-1] <= span["start_s"] <= span["end_s"] <= payload["step_s"], span
            ends.append(span["end_s"])
        assert payload["step_s"] == pytest.approx(metrics["timing_s/step"], abs=1e-5)

        def total(stage, stages=stages):
            return sum(s["end_s"] - s["start_s"] for s in stages if s["stage"] == stage)

        # The spans add up to the stage timings the metrics report.
        for stage in ("rollout", "reward", "weight_sync"):
            assert total(stage) == pytest.approx(metrics[f"timing_s/{stage}"], abs=1e-4), stage
        both = total("logprobs") + total("train")
        assert both == pytest.approx(metrics["timing_s/train"], abs=1e-4)
        assert {s["host"] for s in stages} == {socket.gethostname()}


def test_the_timeline_shows_the_log_prob_passes_and_the_checkpoint_on_its_host(
    tiny_model_dir, tmp_path
):
    # A KL against the reference: the step runs the reference log-prob pass before its update.
    sink = completed_tiny_run(
        tiny_model_dir,
        tmp_path,
        max_steps=2,
        kl={"coef": 0.1, "in_reward": True, "estimator": "k1"},
        algorithm={"algorithm": "reinforce_plus_plus"},
        checkpoint={"dir": str(tmp_path / "ckpt"), "every_steps": 1, "keep_last": 2},
    )
    first, last = [p for kind, p in sink.events if kind == "step.timeline"]
    stages = [s["stage"] for s in first["stages"]]
    assert stages == ["rollout", "reward", "logprobs", "train", "weight_sync", "checkpoint"]
    # The last step's checkpoint is the final one, after the loop: not on a step's timeline.
    assert [s["stage"] for s in last["stages"]][-1] == "weight_sync"
    spans = {s["stage"]: s for s in first["stages"]}
    assert spans["logprobs"]["end_s"] <= spans["train"]["start_s"]
    assert spans["checkpoint"]["start_s"] >= first["step_s"]  # after the step it saves
    metrics = sink.metrics_at(1)
    both = sum(spans[k]["end_s"] - spans[k]["start_s"] for k in ("logprobs", "train"))
    assert both == pytest.approx(metrics["timing_s/train"], abs=1e-4)
    assert {s["host"] for s in first["stages"]} == {socket.gethostname()}
