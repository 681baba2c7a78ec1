"""Rewards throughput, each figure next to a baseline measured in the same run.

1. Unit-test rubric on MBPP-style samples (a function plus three asserts), through the rubric
   API (``score_batch``): evaluations per second on the default zygote path (each evaluation
   a fork of a pre-imported Python in a long-lived sandbox) and on the fresh-sandbox path
   (every sample in its own sandbox), next to the sandbox's own bare-run rate (fresh
   sandbox, ``python3 -c pass``, same concurrency) — the ceiling of the fresh path. The same
   tasks again as HumanEval ``check(candidate)`` suites. Each evaluation holds two processes
   (the judge and the candidate).
2. A rubric with unit tests and ruff (``static_analysis``, which runs in the sample's own
   sandbox): samples per second with that sandbox from the recycling pool (the default on the
   zygote path) and from a fresh pool (``CodeSandboxes.recycles`` forced off), alternated.
3. Answer and numeric criteria (math_equivalence + numeric_match on GSM8K-style responses):
   evaluations per second of CPU time and of wall time, next to a minimal hand-written
   checker (last number == gold) over the same responses.

    .venv/bin/python bench/bench_rewards.py [--code-samples 200] [--workers 4] [--code-only]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rewards import Rubric, Sample

MBPP_TASKS = [
    ("def add(a, b):\n    return a + b", ["add(1, 2) == 3", "add(-1, 1) == 0", "add(10, 5) == 15"]),
    (
        "def is_even(n):\n    return n % 2 == 0",
        ["is_even(2) is True", "is_even(3) is False", "is_even(0) is True"],
    ),
    (
        "def reverse_words(s):\n    return ' '.join(s.split()[::-1])",
        [
            "reverse_words('a b c') == 'c b a'",
            "reverse_words('x') == 'x'",
            "reverse_words('') == ''",
        ],
    ),
    (
        "def max_of(xs):\n    best = xs[0]\n    for x in xs:\n        if x > best:\n"
        "            best = x\n    return best",
        ["max_of([1, 5, 2]) == 5", "max_of([-3, -1]) == -1", "max_of([7]) == 7"],
    ),
    (
        "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s.lower())",
        ["count_vowels('Hello') == 2", "count_vowels('xyz') == 0", "count_vowels('AEIOU') == 5"],
    ),
]


def mbpp_samples(count: int, humaneval: bool = False) -> list[Sample]:
    rng = random.Random(0)
    samples = []
    for i in range(count):
        code, checks = MBPP_TASKS[i % len(MBPP_TASKS)]
        if rng.random() < 0.3:  # some wrong answers, as a policy produces
            code = code.replace("return", "return None and", 1)
        truth: Any = [f"assert {check}" for check in checks]
        if humaneval:
            name = code.split("(")[0].removeprefix("def ")
            body = "".join(f"    assert {c.replace(name + '(', 'candidate(')}\n" for c in checks)
            truth = {"test": f"def check(candidate):\n{body}", "entry_point": name}
        samples.append(
            Sample(
                domain="mbpp",
                prompt="Write the function.",
                completion=f"```python\n{code}\n```",
                ground_truth=truth,
            )
        )
    return samples


def bench_code(count: int, workers: int) -> None:
    from sandboxes import SandboxPool, SandboxSpec

    spec = SandboxSpec(memory_mb=256, timeout_s=10)
    with SandboxPool(max_active=workers) as pool:
        from concurrent.futures import ThreadPoolExecutor

        pool.run(spec, ["python3", "-c", "pass"])  # warm: janitor, cgroup roots, seccomp
        started = time.perf_counter()
        with ThreadPoolExecutor(workers) as threads:
            results = list(
                threads.map(lambda _: pool.run(spec, ["python3", "-c", "pass"]), range(count))
            )
        bare_s = time.perf_counter() - started
    assert all(r.ok for r in results), [r for r in results if not r.ok][:1]
    bare_rate = count / bare_s
    print(f"unit-test rubric, {count} MBPP-style samples (3 asserts each), {workers} at once")
    print(f"  sandbox bare run (fresh sandbox, python3 -c pass): {bare_rate:7.1f} /s")
    runs = [
        ("zygote", 0, False),
        ("zygote", 0, True),
        ("fresh_sandbox", 0, False),
        ("fresh_sandbox", workers, False),
        ("fresh_sandbox", 0, True),
    ]
    for path, prewarm, humaneval in runs:
        samples = mbpp_samples(count, humaneval)
        rubric_spec = {
            "version": 1,
            "criteria": [{"name": "tests", "kind": "unit_tests"}],
            "sandbox": {"memory_mb": 256, "timeout_s": 10, "max_concurrency": workers,
                        "prewarm": prewarm, "python_evaluations": path},
        }  # fmt: skip
        host_cpu = time.process_time()
        with Rubric.from_spec(rubric_spec) as rubric:
            rubric.score(samples[0])  # warm
            started = time.perf_counter()
            scored = rubric.score_batch(samples, max_workers=workers)
            rubric_s = time.perf_counter() - started
        # The host process (rubric, threads, sandbox bookkeeping; the warm-up and the sandboxes'
        # starts included) and, per run, the CPU of the run's own cgroup inside the sandbox
        # (bwrap's setup included on the fresh path; namespace teardown is counted nowhere).
        host_ms = (time.process_time() - host_cpu) / (count + 1) * 1000
        inside = [r.details["tests"]["run"]["cpu_s"] for r in scored]
        inside_ms = sum(inside) / len(inside) * 1000 if None not in inside else float("nan")
        errors = [
            r.details["tests"].get("error") for r in scored if r.details["tests"].get("error")
        ]
        assert not errors, errors[:3]
        mean = sum(r.total for r in scored) / len(scored)
        rate = count / rubric_s
        shape = "check(candidate)" if humaneval else "asserts"
        how = "zygote" if path == "zygote" else f"fresh sandbox each, prewarm={prewarm}"
        print(f"  unit_tests, {shape}, {how}: {rate:7.1f} evals/s"
              f"  = {rate / bare_rate:.2f}x the bare rate; mean reward {mean:.2f};"
              f" CPU per evaluation {host_ms:.1f} ms host + {inside_ms:.1f} ms in the"
              " sandbox")  # fmt: skip


def bench_ruff_pool(count: int, workers: int) -> None:
    from rewards import sandboxing

    samples = mbpp_samples(count)
    rubric_spec = {
        "version": 1,
        "criteria": [
            {"name": "tests", "kind": "unit_tests", "weight": 1},
            {"name": "lint", "kind": "static_analysis", "weight": 0},
        ],
        "sandbox": {"memory_mb": 256, "timeout_s": 10, "max_concurrency": workers},
    }
    default = sandboxing.CodeSandboxes.recycles
    rates: dict[bool, list[float]] = {True: [], False: []}
    try:
        for _ in range(2):
            for recycle in (True, False):
                sandboxing.CodeSandboxes.recycles = property(lambda _self, r=recycle: r)  # type: ignore[method-assign, assignment]
                with Rubric.from_spec(rubric_spec) as rubric:
                    rubric.score_batch(samples[:workers], max_workers=workers)  # warm
                    started = time.perf_counter()
                    scored = rubric.score_batch(samples, max_workers=workers)
                    rates[recycle].append(count / (time.perf_counter() - started))
                errors = [r.details["lint"].get("error") for r in scored]
                assert not any(errors), errors[:3]
    finally:
        sandboxing.CodeSandboxes.recycles = default  # type: ignore[method-assign]
    print(f"unit tests + ruff rubric, {count} samples, {workers} at once (two rounds each)")
    for recycle, label in ((True, "recycling pool (default)"), (False, "fresh pool")):
        shown = " / ".join(f"{rate:.1f}" for rate in rates[recycle])
        print(f"  {label}: {shown} samples/s")


def gsm8k_samples(count: int) -> list[Sample]:
    rng = random.Random(1)
    templates = [
        "Let me work it out. First {a} + {b} = {c}. So the answer is \\boxed{{{c}}}.",
        "Adding the two amounts gives {c:,} dollars in total.\n#### {c}",
        "Step 1: {a}. Step 2: {b}. The final answer is {c}.",
        "<think>{a} plus {b}</think><answer>{c}</answer>",
        "We find x = {c} after simplifying; thus {c} apples.",
    ]
    samples = []
    for _ in range(count):
        a, b = rng.randint(1, 10**6), rng.randint(1, 10**6)
        c = a + b if rng.random() < 0.7 else a + b + rng.randint(1, 9)
        text = rng.choice(templates).format(a=a, b=b, c=c)
        samples.append(Sample(domain="gsm8k", prompt="q", completion=text, ground_truth=str(a + b)))
    return samples


_LAST_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def bench_answers(count: int) -> None:
    samples = gsm8k_samples(count)
    spec = {
        "version": 1,
        "criteria": [
            {"name": "math", "kind": "math_equivalence"},
            {"name": "number", "kind": "numeric_match", "params": {"rel_tol": 1e-6}},
        ],
    }
    rubric = Rubric.from_spec(spec)
    rubric.score_batch(samples[:200])  # warm the caches of the gold answers' parses
    cpu, wall = time.process_time(), time.perf_counter()
    results = rubric.score_batch(samples)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    evaluations = 2 * len(samples)

    def naive(sample: Sample) -> float:
        numbers = _LAST_NUMBER.findall(sample.response)
        return float(bool(numbers) and numbers[-1].replace(",", "") == sample.ground_truth)

    base_cpu = time.process_time()
    naive_scores = [naive(s) for s in samples]
    base_cpu = time.process_time() - base_cpu
    agreement = sum((r.breakdown["math"] == n) for r, n in zip(results, naive_scores, strict=True))
    print(f"answer + numeric criteria, {count} GSM8K-style samples, 2 criteria each")
    print(f"  rubric: {evaluations / cpu:9.0f} evals per CPU-second, "
          f"{evaluations / wall:9.0f} evals/s wall")  # fmt: skip
    print(f"  baseline (regex last number == gold, no rubric): {count / base_cpu:9.0f} per CPU-s"
          f"  -> rubric costs {(cpu / evaluations) / (base_cpu / count):.1f}x the baseline "
          f"per evaluation; agrees with it on {agreement / count:.0%}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--code-samples", type=int, default=200)
    parser.add_argument("--answer-samples", type=int, default=20000)
    parser.add_argument("--code-only", action="store_true", help="skip the answer criteria")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    load = os.getloadavg()
    print(
        f"machine: {os.cpu_count()} cores, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    )
    if not args.code_only:
        bench_answers(args.answer_samples)
    bench_code(args.code_samples, args.workers)
    bench_ruff_pool(min(args.code_samples, 100), args.workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
