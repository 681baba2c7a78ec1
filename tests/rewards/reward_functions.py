"""Installed reward functions the python_function tests load by dotted path."""

from __future__ import annotations

import time


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl style: 1 when the solution ends with the ground truth."""
    return {"score": float(solution_str.strip().endswith(str(ground_truth))), "source": data_source}


def compute_score_three(data_source, solution_str, ground_truth):
    return 0.25


def reward_func(prompts, completions, **kwargs):
    """TRL style: the completion's length in characters over 10, per completion."""
    return [len(c if isinstance(c, str) else c[-1]["content"]) / 10 for c in completions]


def reward_with_column(prompts, completions, answer, **kwargs):
    return [1.0 if str(a) in c else 0.0 for a, c in zip(answer, completions, strict=True)]


def not_applicable(prompts, completions, **kwargs):
    return [None for _ in completions]


def sleeps(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(5)
    return 1.0


def crashes(data_source, solution_str, ground_truth, extra_info=None):
    raise RuntimeError("boom")


def wrong_signature(text):
    return 1.0


def returns_nan(data_source, solution_str, ground_truth, extra_info=None):
    return float("nan")


CALLS: list[int] = []


def counting_reward(prompts, completions, **kwargs):
    """Records the batch size of each call; 1.0 for completions containing 'ok'."""
    CALLS.append(len(completions))
    return [1.0 if "ok" in c else 0.0 for c in completions]


def fails_in_batch(prompts, completions, **kwargs):
    """Fails on any batch holding 'bad': the rubric must fall back to one at a time."""
    if len(completions) > 1 and any("bad" in c for c in completions):
        raise ValueError("cannot handle this batch")
    if completions[0] == "bad":
        raise ValueError("bad sample")
    return [0.5 for _ in completions]
