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
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training.demo import demo_domains  # noqa: E402
from training.models import ensure_demo_model  # noqa: E402
from training.rollout import RolloutEngineConfig, SamplingConfig, make_engine  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="bench")
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    model_dir = ensure_demo_model(size=args.size)
    domains = demo_domains()
    per_domain = -(-args.prompts // len(domains))
    tasks = [t for d in domains for t in d.make_tasks(per_domain, seed=0, split="test")]
    prompts = [t["prompt"] for t in tasks][: args.prompts]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.new_tokens, seed=0)
    load = os.getloadavg()[0]

    hf = measure("hf", model_dir, prompts, sampling)
    vllm = measure("vllm", model_dir, prompts, sampling)
    print(
        f"model {model_dir} ({args.size}); {len(prompts)} prompts × ≤{args.new_tokens} new tokens"
    )
    print(f"load average before: {load:.1f} on {os.cpu_count()} cores")
    for name, figures in (("transformers", hf), ("vLLM", vllm)):
        print(
            f"{name:>12}: {figures['tokens']:6d} tokens in {figures['gen_s']:6.2f} s = "
            f"{figures['tok_s']:7.0f} tok/s (engine start {figures['start_s']:.1f} s)"
        )
    print(f"vLLM / transformers throughput: {vllm['tok_s'] / hf['tok_s']:.2f}×")


if __name__ == "__main__":
    main()
