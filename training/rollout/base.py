"""The rollout-engine contract shared by the vLLM and ``transformers`` engines.

An engine turns prompts into sampled completions with the token ids and the log-probability
of every chosen token (under the sampling distribution's *unmodified* logits, i.e. the policy's
own log-probabilities, which is what importance ratios in the trainer need), and records the
policy version that produced each one. ``update_weights`` loads new tensors into the running
engine without a restart and bumps the version, so a trajectory always says which weights made
it.

Engine options (``RolloutEngineConfig``, defined without torch in ``training.rollout_config``)
mirror vLLM's names so a spec written for a GPU host reads the same on a CPU box; an option
the platform cannot honour is refused with a message naming it (``EngineOptionError``), never
silently dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import torch

from training.rollout_config import EngineOptionError, RolloutEngineConfig

__all__ = [
    "EngineOptionError",
    "FinishReason",
    "RolloutEngine",
    "RolloutEngineConfig",
    "RolloutOutput",
    "SamplingConfig",
    "make_engine",
]

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample. ``seed`` makes sampling reproducible; ``stop`` ends a completion at any
    of these strings (kept in the output, so the text and token ids agree). ``ignore_eos``
    generates exactly ``max_new_tokens`` (benchmarks of fixed-length batches)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    n: int = 1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        problems = []
        if self.temperature < 0:
            problems.append(f"temperature must be ≥ 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            problems.append(f"max_new_tokens must be ≥ 1, got {self.max_new_tokens}")
        if self.n < 1:
            problems.append(f"n must be ≥ 1, got {self.n}")
        if isinstance(self.stop, str):
            problems.append("stop must be a sequence of strings, not one string")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class RolloutOutput:
    """One sampled completion. ``logprobs[i]`` is the log-probability of ``token_ids[i]``."""

    prompt: str
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    policy_version: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class RolloutEngine(Protocol):
    policy_version: int

    def generate(
        self, prompts: Sequence[str], sampling: SamplingConfig
    ) -> list[list[RolloutOutput]]:
        """``sampling.n`` completions for each prompt: ``result[prompt_index][sample_index]``."""
        ...

    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        """Serve these weights from now on (every tensor of the model, tied ones included)."""
        ...

    def close(self) -> None: ...


def make_engine(config: RolloutEngineConfig, model_dir: str | Path) -> RolloutEngine:
    """The engine ``config.engine`` names, serving the model in ``model_dir``."""
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"{model_dir} is not a Hugging Face model directory (no config.json)"
        )
    if config.engine == "hf":
        from training.rollout.hf import HFEngine

        return HFEngine(model_dir, config)
    from training.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(model_dir, config)
