"""One rollout batch, vLLM versus transformers, same prompts and sampling, in one run.

    .venv/bin/python bench/bench_rollout.py [--size bench] [--prompts 128] [--new-tokens 128]

On the ~25M-parameter demo model (``--size bench``; built and cached on first use). Each
engine is started (start-up timed separately), warmed up on a few prompts, then timed on one
batch of ``--prompts`` sampled completions (temperature 1, fixed seed), twice: at a fixed
length (EOS ignored, every sequence ``--new-tokens`` long) and as sampled (sequences end at
EOS, as in RL; ``transformers`` keeps stepping a batch until its longest member ends, vLLM
refills the batch). Throughput counts the tokens each engine really generated. The figure that
compares across runs is the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training.demo import demo_domains
from training.models import ensure_demo_model
from training.rollout import RolloutEngineConfig, SamplingConfig, make_engine


def measure(engine_name: str, model_dir: Path, prompts: list[str], sampling: SamplingConfig):
    started = time.perf_counter()
    engine = make_engine(RolloutEngineConfig(engine=engine_name, max_model_len=512), model_dir)
    start_s = time.perf_counter() - started
    try:
        engine.generate(prompts[:4], SamplingConfig(max_new_tokens=8, seed=1))  # warm-up
        started = time.perf_counter()
        results = engine.generate(prompts, sampling)
        elapsed = time.perf_counter() - started
    finally:
        engine.close()
    tokens = sum(len(o.token_ids) for group in results for o in group)
    return {"start_s": start_s, "gen_s": elapsed, "tokens": tokens, "tok_s": tokens / elapsed}


def child(args: argparse.Namespace) -> None:
    """Measure one engine in this (fresh) process and print the figures as JSON."""
    model_dir = ensure_demo_model(size=args.size)
    domains = demo_domains()
    per_domain = -(-args.prompts // len(domains))
    tasks = [t for d in domains for t in d.make_tasks(per_domain, seed=0, split="held_out")]
    prompts = [t["prompt"] for t in tasks][: args.prompts]
    sampling = SamplingConfig(
        temperature=1.0, max_new_tokens=args.new_tokens, seed=0, ignore_eos=args.ignore_eos
    )
    print("RESULT " + json.dumps(measure(args.engine, model_dir, prompts, sampling)), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="bench")
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--engine", choices=("hf", "vllm"), help=argparse.SUPPRESS)
    parser.add_argument("--ignore-eos", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if args.engine:
        child(args)
        return

    model_dir = ensure_demo_model(size=args.size)  # build (once) before anything is timed
    load = os.getloadavg()[0]
    print(f"model {model_dir} ({args.size}); {args.prompts} prompts, ≤{args.new_tokens} new tokens")
    print(f"load average before: {load:.1f} on {os.cpu_count()} cores")
    # Each engine in its own process: an in-process vLLM engine pins torch to one thread,
    # which would handicap whatever ran after it in the same process.
    for label, ignore_eos in (("fixed length (EOS ignored)", True), ("as sampled", False)):
        figures = {}
        for engine in ("hf", "vllm"):
            command = [sys.executable, __file__, "--engine", engine, "--size", args.size]
            command += ["--prompts", str(args.prompts), "--new-tokens", str(args.new_tokens)]
            command += ["--ignore-eos"] if ignore_eos else []
            output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            result = [line for line in output.splitlines() if line.startswith("RESULT ")][-1]
            figures[engine] = json.loads(result.removeprefix("RESULT "))
        print(f"-- {label}")
        for name, engine in (("transformers", "hf"), ("vLLM", "vllm")):
            f = figures[engine]
            print(
                f"{name:>12}: {f['tokens']:6d} tokens in {f['gen_s']:6.2f} s = "
                f"{f['tok_s']:7.0f} tok/s (engine start {f['start_s']:.1f} s)"
            )
        ratio = figures["vllm"]["tok_s"] / figures["hf"]["tok_s"]
        print(f"vLLM / transformers throughput: {ratio:.2f}×", flush=True)


if __name__ == "__main__":
    main()
