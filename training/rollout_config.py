"""`RolloutEngineConfig`: which rollout engine a run uses and its options, declared once.

No torch here: the run spec embeds this config (``training.spec``) and a web process validates
specs. ``training.rollout`` re-exports it with the engines that read it. Options mirror vLLM's
names so a spec written for a GPU host reads the same on a CPU box; an option the platform
cannot honour is refused by the engine with a message naming it (`EngineOptionError`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

from pydantic import Field, ValidationError

from training.validation import SpecModel, error_lines

__all__ = ["DTYPES", "ENGINES", "WEIGHT_SYNC_MODES", "EngineOptionError", "RolloutEngineConfig"]

Engine = Literal["hf", "vllm"]
WeightSync = Literal["inprocess", "nccl"]
DType = Literal["float32", "bfloat16", "float16"]
ENGINES: tuple[str, ...] = get_args(Engine)
WEIGHT_SYNC_MODES: tuple[str, ...] = get_args(WeightSync)
DTYPES: tuple[str, ...] = get_args(DType)


class EngineOptionError(ValueError):
    """An engine option is invalid or the platform cannot honour it."""


class RolloutEngineConfig(SpecModel):
    """Which engine, and the options that matter for long contexts and speed.

    ``None`` means "the engine's default". ``speculative`` is vLLM's ``speculative_config``
    dict (for example ``{"method": "ngram", "num_speculative_tokens": 4,
    "prompt_lookup_max": 4}``); ``quantization`` is vLLM's method name (``"fp8"``, ``"awq"``,
    ...). ``weight_sync`` picks how trained weights reach the engine: ``inprocess`` (same
    process, one host) or ``nccl`` (broadcast from the trainer's rank 0 to the engine's GPUs
    through vLLM's weight-transfer engine; GPU only). ``extra`` is passed to the engine's
    constructor unchanged, for options not named here.
    """

    engine: Engine = "hf"
    dtype: DType = "float32"
    max_model_len: int | None = Field(default=None, ge=1)
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    kv_cache_dtype: str = "auto"
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    speculative: dict[str, Any] | None = None
    quantization: str | None = None
    gpu_memory_utilization: float = Field(default=0.2, gt=0, le=1)
    weight_sync: WeightSync = "inprocess"
    extra: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolloutEngineConfig:
        """Build from a spec dict; unknown keys and bad values are named in one error."""
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise EngineOptionError("; ".join(error_lines(exc))) from None

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()
