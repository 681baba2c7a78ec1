"""Live weight sync into a running engine versus a plain in-memory copy of the same tensors.

    .venv/bin/python bench/bench_weight_sync.py [--size bench] [--repeats 5]

The baseline copies every tensor of the model into preallocated tensors of the same shape
(``dst.copy_(src)``): the least any sync must do. Against it, in the same run: the vLLM engine's
in-process sync (``collective_rpc`` + ``reload_weights``, prefix cache reset) and the
transformers engine's (``copy_into_module``, with name and shape checks). Medians of
``--repeats`` syncs, each with fresh tensors; the ratio is what compares across runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training.models import ensure_demo_model
from training.rollout import RolloutEngineConfig, make_engine


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="bench")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    model_dir = ensure_demo_model(size=args.size)

    hf = make_engine(RolloutEngineConfig(engine="hf"), model_dir)
    weights = {n: t.detach().clone() for n, t in hf.model.state_dict().items()}
    megabytes = sum(t.numel() * t.element_size() for t in weights.values()) / 2**20
    targets = {n: torch.empty_like(t) for n, t in weights.items()}

    def plain_copy() -> None:
        for name, tensor in weights.items():
            targets[name].copy_(tensor)

    version = iter(range(1, 10_000))
    load = os.getloadavg()[0]
    copy_s = timed(plain_copy, args.repeats)
    hf_s = timed(lambda: hf.update_weights(weights.items(), next(version)), args.repeats)
    hf.close()
    vllm = make_engine(RolloutEngineConfig(engine="vllm", max_model_len=512), model_dir)
    try:
        vllm_s = timed(lambda: vllm.update_weights(weights.items(), next(version)), args.repeats)
    finally:
        vllm.close()

    print(f"model {model_dir} ({args.size}): {len(weights)} tensors, {megabytes:.1f} MiB")
    print(f"load average before: {load:.1f} on {os.cpu_count()} cores; medians of {args.repeats}")
    print(f"plain in-memory copy : {copy_s * 1000:8.1f} ms")
    print(f"transformers sync    : {hf_s * 1000:8.1f} ms  ({hf_s / copy_s:.1f}× the copy)")
    print(f"vLLM in-process sync : {vllm_s * 1000:8.1f} ms  ({vllm_s / copy_s:.1f}× the copy)")


if __name__ == "__main__":
    main()
