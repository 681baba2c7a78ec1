"""Our loop against TRL's ``GRPOTrainer`` on the same model, tasks, rubric, batch and settings.

    .venv/bin/python bench/bench_trl.py                       # parity, seeds 0-2, both sides
    .venv/bin/python bench/bench_trl.py --seeds 0 1 2 3 4 --steps 64
    .venv/bin/python bench/bench_trl.py --speed-only --size bench --engine vllm --steps 4
    .venv/bin/python bench/bench_trl.py --speed-only --size bench --engine vllm --bf16 both

TRL lives in its own environment (``bench/trl_env.sh`` makes ``var/trl-venv``; never in the
project's dependencies) that shares the project's torch and transformers builds. Each side runs
in its own process, one torch thread each, one after the other:

- **ours**: ``training.run`` with ``training.presets.learning_run_dict`` (GRPO, 16 prompts x 8,
  temperature 1.2, lr 3e-4 with 8 warm-up steps, entropy bonus 0.01, no KL, clip 0.2, grad
  clip 1.0, seq-mean-token-mean).
- **TRL**: ``GRPOConfig`` with the same numbers (``per_device_train_batch_size`` 128 completions
  = 16 prompts x ``num_generations`` 8, ``loss_type="grpo"``, ``scale_rewards="group"``,
  ``beta`` 0, ``entropy_coef`` 0.01, ``constant_with_warmup``), its reward function the same
  ``rewards.Rubric`` our loop scores with.

Reported per seed: train reward per step (first and last 8 steps' means), held-out reward
(greedy, the same 64 balanced test-split tasks, the same rubric) before and after, and seconds
per step (the median of the steps' wall times; model loading and engine start excluded).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PEER_PYTHON = ROOT / "var" / "trl-venv" / "bin" / "python"


def held_out_reward(model_dir: str, domain_name: str) -> float:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rewards.rubric import Rubric
    from training.demo.domains import get_domain
    from training.models import greedy_complete
    from training.presets import HELD_OUT_TASKS, balanced_held_out

    domain = get_domain(domain_name)
    tasks = balanced_held_out(domain, HELD_OUT_TASKS)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        completions = greedy_complete(
            model, tokenizer, [t["prompt"] for t in tasks], domain.max_new_tokens
        )
    rubric = Rubric.from_spec(domain.rubric_spec)
    scored = rubric.score_batch(
        [
            {
                "domain": domain_name,
                "prompt": t["prompt"],
                "completion": c,
                "ground_truth": t["ground_truth"],
                "metadata": t["metadata"],
            }
            for t, c in zip(tasks, completions, strict=True)
        ]
    )
    return sum(r.total for r in scored) / len(scored)


def side_ours(args: argparse.Namespace) -> dict[str, Any]:
    from training import ListSink, RunSpec, StaticControl, run
    from training.presets import learning_run_dict

    data = learning_run_dict(args.domain, seed=args.seed, steps=args.steps, model_dir=args.model)
    data["rollout"] = {"engine": args.engine}
    data["autocast"] = "bf16" if args.bf16 in ("ours", "both") else "off"
    if args.speed_only:
        data["eval"] = {"tasks_per_domain": 0}
    sink = ListSink()
    outcome = run(RunSpec.from_dict(data), sink, StaticControl())
    if outcome.status != "completed":
        raise SystemExit(f"ours: {outcome.error}")
    steps = range(1, outcome.step + 1)
    result: dict[str, Any] = {
        "rewards": [sink.metrics_at(s)["reward/mean"] for s in steps],
        "step_s": [sink.metrics_at(s)["timing_s/step"] for s in steps],
    }
    if not args.speed_only:
        result["before"] = outcome.eval_history[0][1]["eval/reward/mean"]
        result["after"] = outcome.eval_history[-1][1]["eval/reward/mean"]
    return result


def side_trl(args: argparse.Namespace) -> dict[str, Any]:
    import tempfile

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rewards.rubric import Rubric
    from training.demo.domains import get_domain
    from training.models import ensure_demo_model

    torch.set_num_threads(1)
    model_dir = str(ensure_demo_model() if args.model == "demo" else args.model)
    domain = get_domain(args.domain)
    tasks = domain.make_tasks(512, seed=0, split="train")
    rubric = Rubric.from_spec(domain.rubric_spec)
    dataset = Dataset.from_list(
        [{"prompt": t["prompt"], "ground_truth": str(t["ground_truth"])} for t in tasks]
    )

    def reward_rubric(prompts, completions, ground_truth, **_: Any) -> list[float]:
        samples = [
            {"domain": args.domain, "prompt": p, "completion": c, "ground_truth": g}
            for p, c, g in zip(prompts, completions, ground_truth, strict=True)
        ]
        return [float(r.total) for r in rubric.score_batch(samples)]

    step_times: list[float] = []
    rewards: list[float] = []

    class Timer(TrainerCallback):  # type: ignore[misc]
        started = 0.0

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            Timer.started = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            step_times.append(time.perf_counter() - Timer.started)

        def on_log(self, _args: Any, _state: Any, _control: Any, logs: Any = None, **__: Any):
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))

    before = None if args.speed_only else held_out_reward(model_dir, args.domain)
    out = tempfile.mkdtemp(prefix="trl-")
    config = GRPOConfig(
        output_dir=out,
        seed=args.seed,
        max_steps=args.steps,
        learning_rate=3e-4,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=8,
        per_device_train_batch_size=128,
        gradient_accumulation_steps=1,
        num_generations=8,
        max_completion_length=domain.max_new_tokens,
        temperature=1.2,
        beta=0.0,
        epsilon=0.2,
        loss_type="grpo",
        scale_rewards="group",
        entropy_coef=0.01,
        max_grad_norm=1.0,
        weight_decay=0.0,
        use_cpu=True,
        # accelerate's CPU mixed precision: torch.autocast(bf16) around forward, as ours.
        bf16=args.bf16 == "both",
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=reward_rubric,
        args=config,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        callbacks=[Timer()],
    )
    trainer.train()
    result: dict[str, Any] = {"rewards": rewards, "step_s": step_times}
    if not args.speed_only:
        trainer.save_model(out + "/final")
        AutoTokenizer.from_pretrained(model_dir).save_pretrained(out + "/final")
        result["before"] = before
        result["after"] = held_out_reward(out + "/final", args.domain)
    return result


def run_side(side: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    python = sys.executable if side == "ours" else str(PEER_PYTHON)
    command = [python, __file__, "--side", side, "--seed", str(seed), "--steps", str(args.steps)]
    command += ["--domain", args.domain, "--model", args.model, "--engine", args.engine]
    command += ["--speed-only"] if args.speed_only else []
    command += ["--bf16", args.bf16]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"{side} (seed {seed}) failed with exit code {done.returncode}")
    return dict(json.loads(lines[-1][len("RESULT ") :]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--side", choices=["ours", "trl"], default=None)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--domain", default="parity")
    parser.add_argument("--model", default="demo", help="'demo' or a model directory")
    parser.add_argument("--size", choices=["test", "bench"], default="test")
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf", help="our rollouts")
    parser.add_argument("--speed-only", action="store_true", help="no held-out evaluation")
    parser.add_argument(
        "--bf16",
        choices=["none", "ours", "both"],
        default="none",
        help="bf16 autocast in the update: on neither side, ours only, or both (TRL's bf16=True)",
    )
    args = parser.parse_args()
    if args.side is not None:
        result = side_ours(args) if args.side == "ours" else side_trl(args)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    if not PEER_PYTHON.exists():
        subprocess.run([str(ROOT / "bench" / "trl_env.sh")], check=True)
    if args.size == "bench" and args.model == "demo":
        from training.models import ensure_demo_model

        args.model = str(ensure_demo_model(size="bench"))
    print(
        f"{args.domain}, {args.steps} steps, model {args.model} ({args.size}), "
        f"our rollouts: {args.engine}; TRL: transformers generate; bf16 autocast: {args.bf16}"
    )
    print(
        f"{'seed':>4} {'side':<5} {'reward first8':>13} {'last8':>6} "
        f"{'held-out before':>15} {'after':>6} {'s/step':>7}"
    )
    per_side: dict[str, list[dict[str, Any]]] = {"ours": [], "trl": []}
    for seed in args.seeds:
        for side in ("ours", "trl"):
            r = run_side(side, args, seed)
            per_side[side].append(r)
            median = statistics.median(r["step_s"][1:] or r["step_s"])
            held = (
                f"{r['before']:>15.3f} {r['after']:>6.3f}"
                if "before" in r
                else f"{'-':>15} {'-':>6}"
            )
            print(
                f"{seed:>4} {side:<5} {statistics.mean(r['rewards'][:8]):>13.3f} "
                f"{statistics.mean(r['rewards'][-8:]):>6.3f} {held} {median:>7.3f}",
                flush=True,
            )
    ours = statistics.median(s for r in per_side["ours"] for s in r["step_s"][1:])
    theirs = statistics.median(s for r in per_side["trl"] for s in r["step_s"][1:])
    print(f"\nmedian s/step: ours {ours:.3f}, TRL {theirs:.3f}, ratio ours/TRL {ours / theirs:.2f}")
    if not args.speed_only:
        for side, results in per_side.items():
            learned = sum(
                r["after"] - r["before"] > max(0.25, 3 * math.sqrt(0.5 / HELD)) for r in results
            )
            print(f"{side}: held-out rise beyond the bar on {learned}/{len(results)} seeds")
    return 0


HELD = 64  # held-out tasks; the bar uses the larger of 0.25 and 3 SE of two chance-level means


if __name__ == "__main__":
    raise SystemExit(main())
