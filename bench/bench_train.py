"""Training benchmarks, each against a baseline measured in the same run.

    .venv/bin/python bench/bench_train.py [--part step|zero|all] [--steps 3]

1. **One RL step by stage, vLLM vs transformers rollout** (``--part step``): the same spec
   (GRPO, 16 prompts x 4 samples x 64 new tokens, ZeRO-1) run through `training.run` on a
   ~25M-parameter Llama-shaped model (hidden 512, 8 layers, the demo tokenizer; random weights:
   timing does not depend on what the model knows, and an untrained model never stops early, so
   both engines generate exactly the same number of tokens). Reports ``timing_s/{rollout,
   reward,train,weight_sync,step}`` of the last step (the first is warm-up) for each engine, and
   the rollout and step ratios.
2. **Training tokens/s, ZeRO-1 vs ZeRO-2** (``--part zero``): two ranks under ``torchrun``
   (gloo, CPU), the same synthetic rows (64 sequences of 96 prompt + 64 response tokens) and
   token budget; ``Trainer.train_step`` timed over ``--steps`` steps after one warm-up step.

Machines here are shared and noisy: compare the ratios, not the absolute figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BENCH_MODEL = REPO / "var" / "bench" / "train-25m"


def build_bench_model(target: Path = BENCH_MODEL) -> Path:
    """An untrained ~25M Llama with the demo tokenizer recipe (cached)."""
    if (target / "config.json").is_file():
        return target
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from training.demo.domains import demo_domains
    from training.models import SIZES, train_tokenizer

    shape = SIZES["bench"]
    texts = [p + c for d in demo_domains() for p, c in d.sft_examples(200, 0)]
    tokenizer = train_tokenizer(texts, shape)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_heads,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,  # never stops early: both engines generate the same token count
        pad_token_id=tokenizer.pad_token_id,
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".train-25m.", dir=target.parent))
    LlamaForCausalLM(config).save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    staging.rename(target)
    return target


def step_spec(model_dir: Path, engine: str, out: Path, steps: int) -> dict:
    from training.demo.domains import get_domain

    domain = get_domain("arithmetic")
    return {
        "name": f"bench-{engine}",
        "base_model": str(model_dir),
        "seed": 0,
        "max_steps": steps,
        "lr": 1e-5,
        "algorithm": {"algorithm": "grpo"},
        "kl": {"coef": 0.0, "reference": True},
        "batch": {"prompts_per_step": 16, "group_size": 4, "micro_batch_tokens": 4096},
        "sampling": {"temperature": 1.0, "max_new_tokens": 64},
        "domains": [
            {
                "name": "arithmetic",
                "rubric_spec": domain.rubric_spec,
                "tasks": domain.make_tasks(64, seed=0),
                "max_new_tokens": 64,
            }
        ],
        "eval": {"at_start": False, "at_end": False},
        "deepspeed": {"zero_optimization": {"stage": 1}},
        "rollout": {"engine": engine, "max_model_len": 512},
        "checkpoint": {"dir": None, "save_final": False, "resume": "none"},
        "output_dir": str(out),
    }


def bench_step(steps: int) -> dict:
    from training import ListSink, RunSpec, StaticControl, run

    model_dir = build_bench_model()
    results = {}
    for engine in ("hf", "vllm"):
        with tempfile.TemporaryDirectory() as tmp:
            sink = ListSink()
            started = time.perf_counter()
            spec = RunSpec.from_dict(step_spec(model_dir, engine, Path(tmp), steps))
            outcome = run(spec, sink, StaticControl())
            if outcome.status != "completed":
                raise SystemExit(f"{engine}: {outcome.status}: {outcome.error}")
            last = sink.metric_rows[-1][1]
            results[engine] = {k: v for k, v in last.items() if k.startswith("timing_s/")}
            results[engine]["response_tokens"] = last["response_length/mean"] * 64
            results[engine]["wall_s_incl_start"] = time.perf_counter() - started
    stages = ["rollout", "reward", "train", "weight_sync", "step"]
    print(f"one RL step on {model_dir.name} (~25M params), last of {steps} steps, seconds:")
    print(f"{'stage':>12} {'transformers':>13} {'vLLM':>8} {'vLLM/hf':>8}")
    for stage in stages:
        hf = results["hf"][f"timing_s/{stage}"]
        vl = results["vllm"][f"timing_s/{stage}"]
        print(f"{stage:>12} {hf:>13.3f} {vl:>8.3f} {vl / hf if hf else float('nan'):>8.2f}")
    return results


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def zero_worker(stage: int, steps: int) -> None:
    """Runs under torchrun: times Trainer.train_step and prints JSON on rank 0."""
    import torch

    from training.algorithms import AlgorithmConfig
    from training.batching import TrainRow
    from training.trainer import Trainer

    trainer = Trainer(
        build_bench_model(),
        {"zero_optimization": {"stage": stage}, "gradient_clipping": 1.0},
        1e-5,
        reference=False,
        micro_batch_tokens=2048,
    )
    generator = torch.Generator().manual_seed(trainer.rank)
    vocab = len(trainer.tokenizer)
    rows = [
        TrainRow(
            torch.randint(0, vocab, (96,), generator=generator).tolist(),
            torch.randint(0, vocab, (64,), generator=generator).tolist(),
            [1.0 if i % 2 else -1.0] * 64,
        )
        for i in range(32)  # per rank: 64 sequences in all
    ]
    algorithm = AlgorithmConfig.preset("grpo")
    trainer.train_step(rows, algorithm)  # warm-up
    started = time.perf_counter()
    for _ in range(steps):
        trainer.train_step(rows, algorithm)
    elapsed = time.perf_counter() - started
    tokens = steps * sum(r.length for r in rows) * trainer.world_size
    if trainer.rank == 0:
        print(json.dumps({"stage": stage, "seconds": elapsed, "tokens": tokens}))


def bench_zero(steps: int) -> dict:
    build_bench_model()
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        raise SystemExit("torchrun not found next to this Python")
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    results = {}
    for stage in (1, 2):
        command = [
            torchrun,
            "--nproc_per_node",
            "2",
            "--master_port",
            str(_free_port()),
            __file__,
            "--zero-worker",
            str(stage),
            "--steps",
            str(steps),
        ]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise SystemExit(f"ZeRO-{stage} worker failed:\n{done.stderr[-3000:]}")
        line = [x for x in done.stdout.splitlines() if x.startswith("{")][-1]
        results[stage] = json.loads(line)
    tps = {s: r["tokens"] / r["seconds"] for s, r in results.items()}
    print(f"training tokens/s, 2 ranks (gloo, CPU), {steps} steps, 64 x 160-token rows per step:")
    ratio = tps[2] / tps[1]
    print(f"  ZeRO-1 {tps[1]:.0f} tok/s   ZeRO-2 {tps[2]:.0f} tok/s   ZeRO-2/ZeRO-1 {ratio:.2f}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=("step", "zero", "all"), default="all")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--zero-worker", type=int, help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args()
    if args.zero_worker is not None:
        zero_worker(args.zero_worker, args.steps)
        return
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process weight sync
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    if args.part in ("zero", "all"):
        bench_zero(args.steps)
    if args.part in ("step", "all"):
        bench_step(max(args.steps, 2))


if __name__ == "__main__":
    main()
