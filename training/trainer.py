"""The DeepSpeed trainer: a policy (and a frozen reference) behind a DeepSpeed engine.

The engine is built from the run spec's ``deepspeed`` dict (ZeRO stage 0-3, bf16/fp16, CPU
offload, gradient clipping ... all DeepSpeed's own keys). The run fills in what it owns:

- ``managed_gradient_accumulation: false`` — micro-batches are formed by a token budget, so
  their number changes from step to step; the trainer calls ``backward`` once per micro-batch
  and ``step`` once per optimiser step (DeepSpeed's own counter would assume a fixed count);
- ``train_micro_batch_size_per_gpu``/``gradient_accumulation_steps`` = 1 (bookkeeping only);
- an AdamW optimiser (``torch_adam`` on the CPU) at the spec's ``lr`` unless the config names
  one, in which case the spec's ``lr`` still wins (one place to read the learning rate).

Loss scaling: each micro-batch's loss is its *share* of the global mini-batch loss (the
algorithms' ``global_tokens``/``global_sequences``), multiplied by the world size because
DeepSpeed averages gradients over ranks. Summed over micro-batches and ranks that is exactly
the loss of the whole mini-batch as if it had been one padded batch on one device.

Distributed: `init_distributed` works alone (world size 1: it sets the rendezvous variables
itself) and under ``deepspeed --num_gpus N`` or ``torchrun --nproc_per_node N``. On a machine
without CUDA it sets ``DS_ACCELERATOR=cpu`` and uses gloo; with CUDA, nccl
(``TRAINING_DIST_BACKEND`` names another: gloo, nccl or auto).
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from training.algorithms import (
    AlgorithmConfig,
    actor_loss,
    entropy_from_logits,
    token_logprobs_from_logits,
    value_loss,
)
from training.batching import (
    MicroBatch,
    TrainRow,
    collate,
    equalize_micro_batch_count,
    plan_micro_batches,
)

__all__ = [
    "MetricSums",
    "MiniBatchTotals",
    "Trainer",
    "build_deepspeed_config",
    "init_distributed",
    "is_main_process",
]

# Loss-valued metrics are shares of the mini-batch loss (they sum over micro-batches and
# ranks); every other per-token metric is averaged with the micro-batch's token count.
_SHARE_METRICS = frozenset({"actor/pg_loss", "actor/kl_loss", "actor/entropy", "critic/vf_loss"})


@dataclass(frozen=True)
class MiniBatchTotals:
    """What every rank must agree on before a mini-batch's first backward pass.

    ``micro_batches`` and ``longest_response`` are maxima over ranks (ZeRO's collectives need
    the same number of passes on every rank; seq-mean-token-sum-norm divides by one constant
    for the whole mini-batch), ``response_tokens`` and ``sequences`` are sums (the loss
    normalisers: each micro-batch's loss is its share of the whole mini-batch's)."""

    micro_batches: int
    longest_response: float
    response_tokens: float
    sequences: float  # a multi-turn episode's turns count their share of one sequence

    @classmethod
    def of(cls, rows: Sequence[TrainRow], micro_batches: int) -> MiniBatchTotals:
        """This rank's totals over its ``rows``, planned as ``micro_batches`` passes."""
        return cls(
            micro_batches=micro_batches,
            longest_response=float(
                max((r.sequence_tokens or len(r.response_ids) for r in rows), default=0)
            ),
            response_tokens=float(sum(len(r.response_ids) for r in rows)),
            sequences=float(sum(r.sequence_share for r in rows if r.response_ids)),
        )

    def across_ranks(self, world_size: int) -> MiniBatchTotals:
        """The totals of the whole mini-batch (a collective call when ``world_size`` > 1).
        Carried in float32 with any world size, so one rank computes what it always did."""
        most = torch.tensor([float(self.micro_batches), self.longest_response])
        summed = torch.tensor([self.response_tokens, self.sequences])
        if world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(most, op=dist.ReduceOp.MAX)
            dist.all_reduce(summed, op=dist.ReduceOp.SUM)
        return MiniBatchTotals(
            micro_batches=int(most[0].item()),
            longest_response=float(most[1].item()),
            response_tokens=float(summed[0].item()),
            sequences=float(summed[1].item()),
        )

    @property
    def loss_tokens(self) -> float:
        """The token-mean normaliser (at least 1: a mini-batch of empty responses)."""
        return max(self.response_tokens, 1.0)

    @property
    def loss_sequences(self) -> float:
        """The sequence-mean normaliser (at least 1)."""
        return max(self.sequences, 1.0)

    def fill_constant_normalizer(self, algorithm: AlgorithmConfig) -> AlgorithmConfig:
        """``algorithm`` with seq-mean-token-sum-norm's constant set to the mini-batch's longest
        response when the algorithm names none: one constant for the whole mini-batch, never a
        micro-batch's own padded width (that would weigh a token by the micro-batch it landed
        in). A run passes its generation budget instead (RunSpec.algorithm_config)."""
        if (
            algorithm.loss_aggregation == "seq-mean-token-sum-norm"
            and algorithm.constant_normalizer is None
        ):
            return algorithm.model_copy(update={"constant_normalizer": self.longest_response})
        return algorithm


@dataclass
class MetricSums:
    """A mini-batch's metrics as they accumulate over its micro-batches, then over ranks.

    ``shares``: loss-valued metrics, each micro-batch's its share of the mini-batch's (they
    sum); ``weighted``: every other per-token metric times the micro-batch's token count (the
    sum divided by ``tokens`` is the token mean)."""

    shares: dict[str, float] = field(default_factory=dict)
    weighted: dict[str, float] = field(default_factory=dict)
    tokens: float = 0.0

    # Every rank adds the whole EWC penalty once (the weights are the same on every rank):
    # its sum over ranks is divided back by the world size.
    _RANK_MEANS = frozenset({"ewc/penalty"})

    def add(self, metrics: dict[str, float], *, tokens: float, has_rows: bool) -> None:
        self.tokens += tokens
        for key, value in metrics.items():
            if key in _SHARE_METRICS:
                self.shares[key] = self.shares.get(key, 0.0) + value
            elif has_rows:
                self.weighted[key] = self.weighted.get(key, 0.0) + value * tokens

    def across_ranks(self, world_size: int) -> dict[str, float]:
        """The mini-batch's metrics: one float64 all-reduce of every sum by name (every rank
        holds the same names), then shares as summed and the others as token means."""
        shares, weighted = sorted(self.shares), sorted(self.weighted)
        packed = torch.tensor(
            [self.shares[k] for k in shares] + [self.weighted[k] for k in weighted] + [self.tokens],
            dtype=torch.float64,
        )
        if world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(packed, op=dist.ReduceOp.SUM)
        summed = dict(zip([*shares, *weighted], packed.tolist(), strict=False))
        token_total = max(float(packed[-1].item()), 1.0)
        result = {
            key: summed[key] / (world_size if key in self._RANK_MEANS else 1) for key in shares
        }
        result.update({key: summed[key] / token_total for key in weighted})
        return result


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def init_distributed() -> tuple[int, int]:
    """Initialises torch.distributed through DeepSpeed once; returns ``(rank, world_size)``."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import torch.distributed as dist

    if not dist.is_initialized():
        # A launcher may name the backend (the console's host agent passes its setting);
        # otherwise nccl with CUDA, gloo without.
        backend = os.environ.get("TRAINING_DIST_BACKEND", "auto")
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if "RANK" not in os.environ:  # not under a launcher: a world of one
            # DeepSpeed reads these; nothing listens on the port.
            os.environ.update(
                RANK="0",
                LOCAL_RANK="0",
                WORLD_SIZE="1",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(_free_port()),
            )
        if os.environ.get("WORLD_SIZE") == "1":
            # A world of one (again, after an in-process vLLM engine tore the last one down)
            # keeps its store in this process: a TCP store on a port found free a moment before
            # can lose it to another process's connection first ("DistNetworkError: The server
            # socket has failed to listen", seen once in CI). DeepSpeed adopts the group.
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        deepspeed.init_distributed(dist_backend=backend, verbose=False)
        # DeepSpeed caches a clone of the world group; if an earlier world was torn down in this
        # process (an in-process vLLM engine destroys the default group when it closes), that
        # clone is stale and the next engine fails with "Group ... is not registered".
        from deepspeed.utils import groups

        groups._WORLD_GROUP = None
    if dist.get_world_size() == 1:
        # DeepSpeed's engine reads LOCAL_RANK, which nobody sets when the world was made by
        # someone else (an in-process vLLM engine sets RANK and WORLD_SIZE only) or adopted.
        os.environ.setdefault("LOCAL_RANK", "0")
    return dist.get_rank(), dist.get_world_size()


def is_main_process() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def build_deepspeed_config(user_config: dict[str, Any], lr: float) -> dict[str, Any]:
    """The user's DeepSpeed config with the keys the run owns filled in (see module doc)."""
    config = copy.deepcopy(user_config)
    config["train_micro_batch_size_per_gpu"] = 1
    config["gradient_accumulation_steps"] = 1
    config.pop("train_batch_size", None)
    config["managed_gradient_accumulation"] = False
    config.setdefault("steps_per_print", 10**9)
    config.setdefault("wall_clock_breakdown", False)
    optimizer = config.setdefault("optimizer", {"type": "AdamW", "params": {}})
    params = optimizer.setdefault("params", {})
    params["lr"] = lr
    if not torch.cuda.is_available() and optimizer.get("type", "").lower() in ("adam", "adamw"):
        params.setdefault("torch_adam", True)  # the fused kernels need CUDA
    zero = config.setdefault("zero_optimization", {"stage": 0})
    if zero.get("stage", 0) in (0, 1) and zero.get("overlap_comm"):
        zero["overlap_comm"] = False  # DeepSpeed refuses it with caller-owned accumulation
    return config


class Trainer:
    """Owns the DeepSpeed engine, the reference model and the tokenizer of one run."""

    def __init__(
        self,
        model_dir: str | Path,
        deepspeed_config: dict[str, Any],
        lr: float,
        *,
        seed: int = 0,
        reference: bool = True,
        micro_batch_tokens: int = 4096,
        ewc_penalty: Any = None,
        value_head: bool = False,
        autocast: str = "off",
    ) -> None:
        self.rank, self.world_size = init_distributed()
        self.autocast_dtype = {"off": None, "bf16": torch.bfloat16}[autocast]
        import deepspeed
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_dir = Path(model_dir)
        self.micro_batch_tokens = micro_batch_tokens
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.tokenizer.eos_token_id or 0)
        torch.manual_seed(seed)
        model: torch.nn.Module
        if value_head:  # PPO: actor and critic share the trunk (training.value_head)
            from training.value_head import CausalLMWithValueHead

            model = CausalLMWithValueHead.from_pretrained(
                self.model_dir, seed=seed, dtype=torch.float32
            )
        else:
            model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        model.config.use_cache = False
        self.has_value_head = value_head
        self.config = build_deepspeed_config(deepspeed_config, lr)
        self.zero_stage = int(self.config["zero_optimization"].get("stage", 0))
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=self.config
        )
        self.device = self.engine.device
        self.reference_model = None
        if reference:
            ref = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
            ref.config.use_cache = False
            ref.eval().requires_grad_(False)
            self.reference_model = ref.to(self.device)
        self.ewc_penalty = ewc_penalty.to(self.device) if ewc_penalty is not None else None

    # ------------------------------------------------------------------ model access

    @property
    def module(self) -> torch.nn.Module:
        return self.engine.module

    def current_lr(self) -> float:
        return float(self.engine.get_lr()[0])

    def set_lr(self, lr: float) -> None:
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr

    def _full_parameters(self) -> contextlib.AbstractContextManager[Any]:
        """Inside it every parameter is whole on every rank: under ZeRO-3 a collective call
        (all ranks gather the partitions), elsewhere nothing to do."""
        if self.zero_stage != 3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None)

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor of the policy under its Hugging Face name (tied ones included), full
        size even under ZeRO-3, for the rollout engine's weight sync."""
        lm: Any = self.module.lm if self.has_value_head else self.module
        with self._full_parameters():
            state = {k: v.detach().clone() for k, v in lm.state_dict().items()}
        yield from state.items()

    def save_pretrained(self, path: str | Path, *, writer: bool) -> None:
        """The policy (and its value head) and tokenizer as a Hugging Face directory, whole
        even under ZeRO-3. Every rank must call it; only the ``writer`` writes."""
        # A transformers model or our value-head wrapper: both have save_pretrained.
        module: Any = self.module
        with self._full_parameters():
            if writer:
                module.save_pretrained(str(path), safe_serialization=True)
                self.tokenizer.save_pretrained(str(path))

    # ------------------------------------------------------------------ forward passes

    def _response_logits(self, model: torch.nn.Module, batch: MicroBatch) -> torch.Tensor:
        return self._forward(model, batch)[0]

    def _forward(
        self, model: torch.nn.Module, batch: MicroBatch
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits ``[rows, response, vocab]`` at the positions that score each response token,
        and the value head's outputs at the same positions (``None`` without a head).

        Under ``autocast`` the matrix products run in bf16; the logits come back as fp32, so
        log-probabilities, entropy and the loss are computed as without it."""
        dtype = self.autocast_dtype
        device = batch.input_ids.device.type
        with torch.autocast(device, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            output = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        logits = output.logits.float()
        index = batch.response_positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1])
        values = getattr(output, "values", None)
        if values is not None and not callable(values):
            values = values[:, :-1].gather(1, batch.response_positions).float()
        else:
            values = None
        return logits[:, :-1].gather(1, index), values

    def _scoring_plan(self, rows: Sequence[TrainRow]) -> list[list[int]]:
        """Micro-batches for a forward-only pass over the rows that have a response (a row
        without one scores as ``[]``). Under ZeRO-3 every forward gathers parameters from all
        ranks, so every rank must run as many as the busiest (a collective call then: the
        others run empty ones), or the ranks wait on each other forever."""
        with_response = [i for i, r in enumerate(rows) if r.response_ids]
        plan = plan_micro_batches([rows[i].length for i in with_response], self.micro_batch_tokens)
        groups = [[with_response[j] for j in group] for group in plan]
        if self.zero_stage == 3 and self.world_size > 1:
            import torch.distributed as dist

            most = torch.tensor([float(len(groups))])
            dist.all_reduce(most, op=dist.ReduceOp.MAX)
            groups = equalize_micro_batch_count(groups, int(most.item()))
        return groups

    @torch.no_grad()
    def values(self, rows: Sequence[TrainRow]) -> list[list[float]]:
        """The value head's estimate at each response token of each row (PPO/GAE)."""
        if not self.has_value_head:
            raise RuntimeError("this trainer has no value head (algorithm without a critic)")
        was_training = self.module.training
        self.module.eval()
        result: list[list[float]] = [[] for _ in rows]
        for indices in self._scoring_plan(rows):
            batch = collate(rows, indices, self.pad_id, self.device)
            _, values = self._forward(self.module, batch)
            assert values is not None
            for i, index in enumerate(indices):
                result[index] = values[i, : len(rows[index].response_ids)].tolist()
        self.module.train(was_training)
        return result

    @torch.no_grad()
    def logprobs(self, rows: Sequence[TrainRow], *, reference: bool = False) -> list[list[float]]:
        """Per-token log-probabilities of each row's response under the policy (or reference)."""
        model = self.reference_model if reference else self.module
        if model is None:
            raise RuntimeError("this trainer was built without a reference model")
        was_training = model.training
        model.eval()
        result: list[list[float]] = [[] for _ in rows]
        for indices in self._scoring_plan(rows):
            batch = collate(rows, indices, self.pad_id, self.device)
            values = token_logprobs_from_logits(
                self._response_logits(model, batch), batch.response_ids
            )
            for i, index in enumerate(indices):
                result[index] = values[i, : len(rows[index].response_ids)].tolist()
        model.train(was_training)
        return result

    # ------------------------------------------------------------------ one optimiser step

    def train_step(
        self,
        rows: Sequence[TrainRow],
        algorithm: AlgorithmConfig,
        *,
        kl_coef: float | None = None,
        ref_logprobs: Sequence[Sequence[float]] | None = None,
    ) -> dict[str, float]:
        """One optimiser step on this rank's ``rows`` (a collective call: every rank calls it,
        with its own rows). ``rows[i].old_logprobs`` unset means on-policy (ratio 1 at the start:
        the old log-probabilities are the current ones, detached).

        Plan the micro-batches, agree with the other ranks on the mini-batch's totals, one
        backward pass per micro-batch (each loss its share of the mini-batch's), one optimiser
        step, then the metrics reduced over ranks."""
        self.engine.train()
        plan = plan_micro_batches([r.length for r in rows], self.micro_batch_tokens)
        totals = MiniBatchTotals.of(rows, len(plan)).across_ranks(self.world_size)
        if totals.micro_batches == 0:
            # No rank has a row (every group dropped for zero variance, say): stepping anyway
            # would move the weights by Adam's momentum and weight decay with no data behind it.
            return {
                "actor/lr": self.current_lr(),
                "perf/micro_batches": 0.0,
                "perf/train_tokens": 0.0,
                "train/skipped": 1.0,
            }
        plan = equalize_micro_batch_count(plan, totals.micro_batches)
        algorithm = totals.fill_constant_normalizer(algorithm)
        sums = MetricSums()
        for micro_index, indices in enumerate(plan):
            batch = collate(rows, indices, self.pad_id, self.device)
            loss, metrics = self._micro_batch_loss(
                batch, rows, algorithm, totals, kl_coef=kl_coef, ref_logprobs=ref_logprobs
            )
            if self.ewc_penalty is not None and micro_index == 0:
                penalty = self.ewc_penalty(self.module)
                loss = loss + penalty
                sums.shares["ewc/penalty"] = float(penalty.detach())
            self.engine.backward(loss, scale_wrt_gas=False)
            sums.add(metrics, tokens=float(batch.response_tokens), has_rows=not batch.is_empty)
        grad_norm = self._optimizer_step()
        result = sums.across_ranks(self.world_size)
        result["actor/grad_norm"] = grad_norm
        result["actor/lr"] = self.current_lr()
        result["perf/micro_batches"] = float(len(plan))
        result["perf/train_tokens"] = totals.loss_tokens
        result["train/skipped"] = 0.0
        return result

    def _micro_batch_loss(
        self,
        batch: MicroBatch,
        rows: Sequence[TrainRow],
        algorithm: AlgorithmConfig,
        totals: MiniBatchTotals,
        *,
        kl_coef: float | None,
        ref_logprobs: Sequence[Sequence[float]] | None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's share of the mini-batch loss (actor, and critic with a value head),
        scaled by the world size (DeepSpeed averages gradients over ranks), and its metrics.
        An empty micro-batch gives a zero loss that still runs the collectives."""
        logits, values = self._forward(self.module, batch)
        logprobs = token_logprobs_from_logits(logits, batch.response_ids)
        # The entropy bonus needs its gradient; when it is off, detach to save the graph.
        entropy = entropy_from_logits(logits if algorithm.entropy_coef > 0 else logits.detach())
        old = batch.old_logprobs if batch.old_logprobs is not None else logprobs.detach()
        ref = None
        if ref_logprobs is not None and not batch.is_empty:
            ref = torch.zeros_like(logprobs)
            for i, index in enumerate(batch.indices):
                n = len(rows[index].response_ids)
                ref[i, :n] = torch.tensor(ref_logprobs[index][:n], dtype=ref.dtype)
        elif ref_logprobs is not None:
            ref = logprobs.detach()
        loss, metrics = actor_loss(
            algorithm,
            logprobs=logprobs,
            old_logprobs=old,
            advantages=batch.advantages,
            response_mask=batch.response_mask,
            ref_logprobs=ref,
            entropy=entropy,
            kl_coef=kl_coef,
            global_tokens=totals.loss_tokens,
            global_sequences=totals.loss_sequences,
            sequence_tokens=batch.sequence_tokens,
        )
        if values is not None:
            if batch.returns is None or batch.old_values is None:
                raise ValueError("a value head needs returns and old values on every row")
            critic_loss, critic_metrics = value_loss(
                values=values,
                old_values=batch.old_values,
                returns=batch.returns,
                response_mask=batch.response_mask,
                clip_range=algorithm.value_clip,
                aggregation=algorithm.loss_aggregation,
                global_tokens=totals.loss_tokens,
                global_sequences=totals.loss_sequences,
                constant_normalizer=algorithm.constant_normalizer,
                sequence_tokens=batch.sequence_tokens,
            )
            loss = loss + algorithm.value_loss_coef * critic_loss
            metrics.update(critic_metrics)
        loss = loss * self.world_size
        if batch.is_empty:
            loss = loss * 0.0  # keeps this rank in step with the others' collectives
        return loss, metrics

    def _optimizer_step(self) -> float:
        """Steps the optimiser; returns the global gradient norm (before clipping)."""
        grad_norm = self._grad_norm_before_step()
        self.engine.step()
        if grad_norm is None:
            reported = self.engine.get_global_grad_norm()
            grad_norm = float(reported) if reported is not None else float("nan")
        return grad_norm

    def _grad_norm_before_step(self) -> float | None:
        """ZeRO-1/2/3 report the global norm after ``step``; stage 0 does not, so it is computed
        here, before ``step`` clips the gradients. At stage 0 DeepSpeed has already averaged
        them over ranks in ``backward``, so this is the global norm with any world size
        (test_distributed checks it against ZeRO-2's)."""
        if self.zero_stage != 0:
            return None
        squares = [
            p.grad.detach().float().pow(2).sum()
            for p in self.module.parameters()
            if p.grad is not None
        ]
        if not squares:
            return 0.0
        return float(math.sqrt(float(torch.stack(squares).sum().item())))
