"""The rollout-engine contract shared by the vLLM and ``transformers`` engines.

An engine turns prompts into sampled completions with the token ids and the log-probability
of every chosen token (under the sampling distribution's *unmodified* logits, i.e. the policy's
own log-probabilities, which is what importance ratios in the trainer need), and records the
policy version that produced each one. ``update_weights`` loads new tensors into the running
engine without a restart and bumps the version, so a trajectory always says which weights made
it.

Engine options (``RolloutEngineConfig``) mirror vLLM's names so a spec written for a GPU host
reads the same on a CPU box; an option the platform cannot honour is refused with a message
naming it (``EngineOptionError``), never silently dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import torch

FinishReason = Literal["stop", "length"]
ENGINES = ("hf", "vllm")
WEIGHT_SYNC_MODES = ("inprocess", "nccl")
DTYPES = ("float32", "bfloat16", "float16")


class EngineOptionError(ValueError):
    """An engine option is invalid or the platform cannot honour it."""


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


@dataclass(frozen=True)
class RolloutEngineConfig:
    """Which engine, and the options that matter for long contexts and speed.

    ``None`` means "the engine's default". ``speculative`` is vLLM's ``speculative_config``
    dict (for example ``{"method": "ngram", "num_speculative_tokens": 4,
    "prompt_lookup_max": 4}``); ``quantization`` is vLLM's method name (``"fp8"``, ``"awq"``,
    ...). ``weight_sync`` picks how trained weights reach the engine: ``inprocess`` (same
    process, one host) or ``nccl`` (broadcast from the trainer's rank 0 to the engine's GPUs
    through vLLM's weight-transfer engine; GPU only). ``extra`` is passed to the engine's
    constructor unchanged, for options not named here.
    """

    engine: str = "hf"
    dtype: str = "float32"
    max_model_len: int | None = None
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    kv_cache_dtype: str = "auto"
    max_num_batched_tokens: int | None = None
    speculative: dict[str, Any] | None = None
    quantization: str | None = None
    gpu_memory_utilization: float = 0.2
    weight_sync: str = "inprocess"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = validate_engine_config_fields(asdict(self))
        if problems:
            raise EngineOptionError("; ".join(problems))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolloutEngineConfig:
        """Build from a spec dict; unknown keys and bad values are named in one error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        problems = [f"{key}: unknown rollout engine option" for key in unknown]
        problems += validate_engine_config_fields(
            {key: value for key, value in data.items() if key in known}
        )
        if problems:
            raise EngineOptionError("; ".join(problems))
        return cls(**dict(data))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def validate_engine_config_fields(data: Mapping[str, Any]) -> list[str]:
    """Each problem as ``"field: message"`` (every one, not just the first)."""
    problems = []
    if "engine" in data and data["engine"] not in ENGINES:
        problems.append(f"engine: must be one of {list(ENGINES)}, got {data['engine']!r}")
    if "dtype" in data and data["dtype"] not in DTYPES:
        problems.append(f"dtype: must be one of {list(DTYPES)}, got {data['dtype']!r}")
    if "weight_sync" in data and data["weight_sync"] not in WEIGHT_SYNC_MODES:
        problems.append(
            f"weight_sync: must be one of {list(WEIGHT_SYNC_MODES)}, got {data['weight_sync']!r}"
        )
    for name in ("max_model_len", "max_num_batched_tokens"):
        value = data.get(name)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 1
        ):
            problems.append(f"{name}: must be a positive integer or null, got {value!r}")
    for name in ("enable_chunked_prefill", "enable_prefix_caching"):
        value = data.get(name)
        if value is not None and not isinstance(value, bool):
            problems.append(f"{name}: must be true, false or null, got {value!r}")
    utilization = data.get("gpu_memory_utilization", 0.2)
    if not isinstance(utilization, int | float) or not 0 < utilization <= 1:
        problems.append(f"gpu_memory_utilization: must be in (0, 1], got {utilization!r}")
    speculative = data.get("speculative")
    if speculative is not None and not isinstance(speculative, dict):
        problems.append(
            f"speculative: must be a dict (vLLM speculative_config) or null, got {speculative!r}"
        )
    if not isinstance(data.get("kv_cache_dtype", "auto"), str):
        problems.append("kv_cache_dtype: must be a string such as 'auto' or 'fp8'")
    quantization = data.get("quantization")
    if quantization is not None and not isinstance(quantization, str):
        problems.append(f"quantization: must be a method name or null, got {quantization!r}")
    if not isinstance(data.get("extra", {}), dict):
        problems.append("extra: must be a dict of engine keyword arguments")
    return problems


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
