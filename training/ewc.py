"""Elastic weight consolidation (EWC): keep what earlier domains taught the model.

At a checkpoint after training on earlier domains, ``estimate_fisher`` measures how much each
parameter matters to them: the diagonal of the (empirical) Fisher information, i.e. the squared
gradient of the log-likelihood of held-out samples of those domains, averaged over samples.
``EWCPenalty`` then adds ``strength / 2 * sum_i F_i * (theta_i - anchor_i)^2`` to the loss of
later training, pulling the parameters that mattered back towards their values at the
checkpoint while leaving the others free (Kirkpatrick et al., 2017).

Per-sample gradients: ``loss_fn(model, batch)`` returns either one negative log-likelihood per
sample (``[n]``, each squared separately: the real diagonal Fisher) or a scalar (the batch is
then one sample: cheaper, and an underestimate, because gradients of different samples cancel
before squaring). ``causal_lm_nll`` is the per-sample loss for a causal LM (or one wrapped with
a value head) on ``{"input_ids", "attention_mask", "labels"}`` batches built by
``fisher_batches``.

Empirical versus true Fisher: with the held-out samples' own targets, a model that already fits
them exactly has zero gradients and so a zero Fisher; ``loss_fn`` may instead score targets
sampled from the model itself (the true Fisher). For LM domains with reference answers the
empirical Fisher is the usual choice and is what ``causal_lm_nll`` computes.

Only parameters that receive a non-zero gradient are kept: a value head, which the
log-likelihood does not touch, gets no entry and no penalty. Gradients are taken with
``torch.autograd.grad``, so the model's ``.grad`` buffers (and a pending optimiser step) are
left exactly as they were.

With DeepSpeed, estimate and penalise on ``engine.module``: ZeRO stages 0-2 keep full
parameters on every rank; ZeRO-3 partitions them, and this module refuses them with a clear
message rather than computing a Fisher of empty shards. Under ``torch.distributed`` the Fisher
is averaged over ranks (each rank's samples count once).

Saved with checkpoints as one safetensors file (``EWCPenalty.save`` / ``EWCPenalty.load``):
Fisher and anchor tensors plus the strength and a free-form ``info`` dict (the domains and the
step the anchor was taken at); or as two ``{name: tensor}`` files (``save_parts`` /
``from_paths``) for a run spec that names a Fisher file and an anchor file.

Names: a Fisher estimated on a bare LM applies unchanged to the same LM inside
``CausalLMWithValueHead`` (``lm.`` prefix) or a ``module.`` wrapper, and the other way round;
any other mismatch is refused with the names shown.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch import nn

__all__ = [
    "EWC_FILENAME",
    "EWCPenalty",
    "causal_lm_nll",
    "estimate_fisher",
    "fisher_batches",
    "load_tensor_dict",
]

EWC_FILENAME = "ewc.safetensors"
_FISHER_PREFIX = "fisher/"
_ANCHOR_PREFIX = "anchor/"

LossFn = Callable[[nn.Module, Any], torch.Tensor]
ParamFilter = Callable[[str, nn.Parameter], bool]


def _check_not_partitioned(name: str, param: nn.Parameter) -> None:
    # DeepSpeed ZeRO-3 replaces each parameter by an empty placeholder plus ds_* attributes.
    if hasattr(param, "ds_numel") and param.numel() != getattr(param, "ds_numel", 0):
        raise ValueError(
            f"parameter {name!r} is partitioned by ZeRO-3; EWC needs full parameters "
            "(use ZeRO stage 0-2, or gather them with deepspeed.zero.GatheredParameters)"
        )


def estimate_fisher(
    model: nn.Module,
    batches: Iterable[Any],
    loss_fn: LossFn,
    *,
    max_samples: int | None = None,
    param_filter: ParamFilter | None = None,
    normalize: str | None = None,
    reduce_across_ranks: bool = True,
) -> dict[str, torch.Tensor]:
    """Diagonal Fisher ``{parameter name: float32 tensor}`` averaged over samples.

    ``loss_fn(model, batch)`` returns the negative log-likelihood per sample (``[n]``) or one
    scalar per batch (see the module docstring). ``max_samples`` stops early. ``param_filter``
    picks parameters (default: every one with ``requires_grad``). ``normalize="mean"`` divides
    by the mean Fisher entry and ``"max"`` by the largest, so the EWC strength has a meaning
    that does not depend on the model's size or on how small raw LM gradients are; ``None``
    (default) keeps the raw values. The model is put in eval mode (no dropout) for the
    estimate and restored afterwards.
    """
    if normalize not in (None, "mean", "max"):
        raise ValueError(f"normalize must be None, 'mean' or 'max', got {normalize!r}")
    if max_samples is not None and max_samples <= 0:
        raise ValueError(f"max_samples must be positive, got {max_samples}")
    named = [
        (name, param)
        for name, param in model.named_parameters()
        if param.requires_grad and (param_filter is None or param_filter(name, param))
    ]
    if not named:
        raise ValueError("no trainable parameters selected for the Fisher estimate")
    for name, param in named:
        _check_not_partitioned(name, param)
    params = [param for _, param in named]
    sums: list[torch.Tensor | None] = [None] * len(params)
    samples = 0
    was_training = model.training
    model.eval()
    try:
        for batch in batches:
            if max_samples is not None and samples >= max_samples:
                break
            losses = loss_fn(model, batch)
            if losses.dim() > 1:
                raise ValueError(f"loss_fn must return a scalar or [n], got {tuple(losses.shape)}")
            per_sample = losses.reshape(-1)
            if max_samples is not None:
                per_sample = per_sample[: max_samples - samples]
            for index in range(per_sample.shape[0]):
                grads = torch.autograd.grad(
                    per_sample[index],
                    params,
                    retain_graph=index < per_sample.shape[0] - 1,
                    allow_unused=True,
                )
                for slot, grad in enumerate(grads):
                    if grad is None:
                        continue
                    squared = grad.detach().float().square()
                    current = sums[slot]
                    sums[slot] = squared if current is None else current.add_(squared)
                samples += 1
            del losses, per_sample
    finally:
        model.train(was_training)
    if samples == 0:
        raise ValueError("no samples for the Fisher estimate (empty batches)")

    count = torch.tensor(float(samples))
    reduce = reduce_across_ranks and dist.is_available() and dist.is_initialized()
    if reduce and dist.get_world_size() > 1:
        device = params[0].device
        count = count.to(device)
        dist.all_reduce(count)
        for slot, param in enumerate(params):
            # Every rank must join every all_reduce, including for tensors it never saw.
            total = sums[slot]
            if total is None:
                total = torch.zeros(param.shape, dtype=torch.float32, device=device)
            dist.all_reduce(total)
            sums[slot] = total
    fisher = {
        name: (total / count.to(total.device))
        for (name, _), total in zip(named, sums, strict=True)
        if total is not None and bool(total.any())
    }
    if not fisher:
        raise ValueError(
            "the Fisher is zero for every selected parameter: the loss gave no gradient, or the "
            "model fits these samples exactly (then sample the targets from the model instead)"
        )
    if normalize is not None:
        flat = torch.cat([f.reshape(-1) for f in fisher.values()])
        scale = flat.mean() if normalize == "mean" else flat.max()
        if scale > 0:
            fisher = {name: f / scale for name, f in fisher.items()}
    return fisher


class EWCPenalty:
    """``strength / 2 * sum_i F_i * (theta_i - anchor_i)^2`` over the parameters in ``fisher``.

    Call it with the model being trained to get a scalar (float32) to add to the loss.
    ``anchor_params`` are the parameter values at the checkpoint (copied, float32);
    ``from_model`` takes them from a model directly. Names are the model's
    ``named_parameters()`` names: estimate the Fisher on the same module you penalise.
    """

    def __init__(
        self,
        fisher: Mapping[str, torch.Tensor],
        anchor_params: Mapping[str, torch.Tensor],
        strength: float,
        *,
        info: Mapping[str, Any] | None = None,
    ) -> None:
        if not fisher:
            raise ValueError("EWC needs a non-empty Fisher")
        self.strength = _check_strength(strength)
        missing = sorted(set(fisher) - set(anchor_params))
        if missing:
            raise ValueError(f"anchor_params lack {len(missing)} Fisher entries: {missing[:5]}")
        self.fisher: dict[str, torch.Tensor] = {}
        self.anchor: dict[str, torch.Tensor] = {}
        for name, weight in fisher.items():
            anchor = anchor_params[name]
            if weight.shape != anchor.shape:
                raise ValueError(
                    f"{name}: Fisher shape {tuple(weight.shape)} != anchor {tuple(anchor.shape)}"
                )
            if bool((weight < 0).any()) or not bool(torch.isfinite(weight).all()):
                raise ValueError(f"{name}: Fisher entries must be finite and >= 0")
            self.fisher[name] = weight.detach().float().clone()
            self.anchor[name] = anchor.detach().float().clone()
        self.info: dict[str, Any] = dict(info or {})

    @classmethod
    def from_model(
        cls,
        model: nn.Module,
        fisher: Mapping[str, torch.Tensor],
        strength: float,
        *,
        info: Mapping[str, Any] | None = None,
    ) -> EWCPenalty:
        params = dict(model.named_parameters())
        return cls(
            fisher, {name: params[name] for name in fisher if name in params}, strength, info=info
        )

    def _matched(self, model: nn.Module) -> list[tuple[str, nn.Parameter]]:
        """``(fisher name, model parameter)`` pairs; raises when the model lacks any."""
        params = dict(model.named_parameters())
        resolve = _name_mapping(list(self.fisher), params)
        if resolve is None:
            missing = [name for name in self.fisher if name not in params]
            example = next(iter(params), "")
            raise ValueError(
                f"the model has no parameter(s) {missing[:3]} (of {len(missing)}) that the "
                f"Fisher names (the model's look like {example!r}); estimate the Fisher on the "
                "same module you penalise"
            )
        matched = []
        for name in self.fisher:
            param = params[resolve(name)]
            _check_not_partitioned(name, param)
            if param.shape != self.fisher[name].shape:
                raise ValueError(
                    f"{name}: model shape {tuple(param.shape)} != Fisher "
                    f"{tuple(self.fisher[name].shape)}"
                )
            matched.append((name, param))
        return matched

    def to(self, device: torch.device | str) -> EWCPenalty:
        """Moves Fisher and anchor to ``device`` (in place) and returns self."""
        self.fisher = {name: t.to(device) for name, t in self.fisher.items()}
        self.anchor = {name: t.to(device) for name, t in self.anchor.items()}
        return self

    def __call__(self, model: nn.Module) -> torch.Tensor:
        total: torch.Tensor | None = None
        for name, param in self._matched(model):
            fisher = self.fisher[name]
            if fisher.device != param.device:
                self.to(param.device)
                fisher = self.fisher[name]
            term = (fisher * (param.float() - self.anchor[name]).square()).sum()
            total = term if total is None else total + term
        assert total is not None  # the constructor refuses an empty Fisher
        return 0.5 * self.strength * total

    def anchor_distance(self, model: nn.Module, *, weighted: bool = False) -> float:
        """L2 distance of the penalised parameters from the anchor (Fisher-weighted if asked):
        how far training has moved what EWC protects."""
        total = 0.0
        with torch.no_grad():
            for name, param in self._matched(model):
                diff = (param.float() - self.anchor[name].to(param.device)).square()
                if weighted:
                    diff = diff * self.fisher[name].to(param.device)
                total += float(diff.sum())
        return total**0.5

    def save(self, path: str | Path) -> Path:
        """Writes one safetensors file (a directory gets ``ewc.safetensors`` inside)."""
        target = Path(path)
        if target.is_dir():
            target = target / EWC_FILENAME
        tensors = {_FISHER_PREFIX + n: t.cpu().contiguous() for n, t in self.fisher.items()}
        tensors.update({_ANCHOR_PREFIX + n: t.cpu().contiguous() for n, t in self.anchor.items()})
        metadata = {"strength": repr(self.strength), "info": json.dumps(self.info)}
        save_file(tensors, str(target), metadata=metadata)
        return target

    def save_parts(self, fisher_path: str | Path, anchor_path: str | Path) -> None:
        """Writes Fisher and anchor as two ``{name: tensor}`` files (``.safetensors`` by
        suffix, else ``torch.save``), the layout a run spec's ``ewc`` section points at."""
        for target, tensors in ((fisher_path, self.fisher), (anchor_path, self.anchor)):
            data = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
            if Path(target).suffix == ".safetensors":
                save_file(data, str(target))
            else:
                torch.save(data, str(target))

    @classmethod
    def from_paths(
        cls,
        fisher_path: str | Path,
        anchor_path: str | Path | None,
        strength: float,
        *,
        info: Mapping[str, Any] | None = None,
    ) -> EWCPenalty:
        """Builds from a run spec's ``ewc`` section: either one file written by ``save``
        (``anchor_path`` None or the same path) or two ``{name: tensor}`` files."""
        if anchor_path is None or Path(anchor_path) == Path(fisher_path):
            return cls.load(fisher_path, strength=strength)
        fisher = load_tensor_dict(fisher_path)
        anchor = load_tensor_dict(anchor_path)
        return cls(fisher, anchor, strength, info=info)

    @classmethod
    def load(cls, path: str | Path, *, strength: float | None = None) -> EWCPenalty:
        """Reads what ``save`` wrote; ``strength`` overrides the saved one."""
        source = Path(path)
        if source.is_dir():
            source = source / EWC_FILENAME
        from safetensors import safe_open

        with safe_open(str(source), framework="pt") as handle:
            metadata = handle.metadata() or {}
        tensors = load_file(str(source))
        fisher = {
            k[len(_FISHER_PREFIX) :]: v for k, v in tensors.items() if k.startswith(_FISHER_PREFIX)
        }
        anchor = {
            k[len(_ANCHOR_PREFIX) :]: v for k, v in tensors.items() if k.startswith(_ANCHOR_PREFIX)
        }
        if not fisher or "strength" not in metadata:
            raise ValueError(f"{source}: not an EWC file written by EWCPenalty.save")
        saved_strength = float(metadata["strength"])
        info = json.loads(metadata.get("info", "{}"))
        return cls(fisher, anchor, saved_strength if strength is None else strength, info=info)


# A Fisher taken on a bare LM and a penalty applied to the same LM inside a wrapper differ only by
# a prefix: "lm." (CausalLMWithValueHead) or "module." (DistributedDataParallel, a DeepSpeed
# engine itself). These are the only renamings resolved; anything else is an error.
_WRAPPER_PREFIXES = ("lm.", "module.", "module.lm.")


def _name_mapping(names: list[str], params: Mapping[str, Any]) -> Callable[[str], str] | None:
    if all(name in params for name in names):
        return lambda name: name
    for prefix in _WRAPPER_PREFIXES:
        if all(prefix + name in params for name in names):
            return lambda name, prefix=prefix: prefix + name  # type: ignore[misc]
        if all(name.startswith(prefix) and name[len(prefix) :] in params for name in names):
            return lambda name, prefix=prefix: name[len(prefix) :]  # type: ignore[misc]
    return None


def load_tensor_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """``{name: tensor}`` from a ``.safetensors`` file or a ``torch.save``d dict (loaded with
    ``weights_only=True``: a checkpoint file is data, never code)."""
    source = Path(path)
    if not source.exists():
        raise FileNotFoundError(f"{source}: no such file")
    if source.suffix == ".safetensors":
        return load_file(str(source))
    loaded = torch.load(str(source), map_location="cpu", weights_only=True)
    if not isinstance(loaded, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items()
    ):
        raise ValueError(f"{source}: expected a dict of parameter name -> tensor")
    return loaded


def _check_strength(strength: float) -> float:
    value = float(strength)
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"EWC strength must be a finite number >= 0, got {strength!r}")
    return value


# --------------------------------------------------------------------------------------------
# Log-likelihood of held-out samples for a causal LM
# --------------------------------------------------------------------------------------------


def causal_lm_nll(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Per-sample negative log-likelihood ``[n]`` of the ``labels`` tokens (``-100`` = not
    scored, e.g. the prompt). Works for a Hugging Face causal LM and for
    ``CausalLMWithValueHead`` (anything whose output has ``.logits``)."""
    device = next(model.parameters()).device
    input_ids = batch["input_ids"].to(device)
    attention_mask = batch.get("attention_mask")
    if attention_mask is not None:
        attention_mask = attention_mask.to(device)
    labels = batch["labels"].to(device)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    shifted_logits = logits[:, :-1].float()
    shifted_labels = labels[:, 1:]
    scored = shifted_labels != -100
    safe_labels = shifted_labels.masked_fill(~scored, 0)
    token_logprobs = (
        shifted_logits.log_softmax(-1).gather(-1, safe_labels.unsqueeze(-1)).squeeze(-1)
    )
    return -(token_logprobs * scored).sum(dim=-1)


def fisher_batches(
    tokenizer: Any,
    samples: Sequence[tuple[str, str]],
    *,
    batch_size: int = 8,
    max_length: int | None = None,
) -> list[dict[str, torch.Tensor]]:
    """Tokenises ``(prompt, completion)`` pairs into right-padded batches for
    ``causal_lm_nll``: only the completion tokens are scored."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    rows: list[tuple[list[int], list[int]]] = []
    for prompt, completion in samples:
        prompt_ids = list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
        completion_ids = list(tokenizer(completion, add_special_tokens=False)["input_ids"])
        ids = prompt_ids + completion_ids
        scored = [-100] * len(prompt_ids) + completion_ids
        if max_length is not None:
            ids, scored = ids[:max_length], scored[:max_length]
        rows.append((ids, scored))
    batches: list[dict[str, torch.Tensor]] = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        width = max(len(ids) for ids, _ in chunk)
        input_ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        labels = torch.full((len(chunk), width), -100, dtype=torch.long)
        attention = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, (ids, labs) in enumerate(chunk):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            labels[row, : len(labs)] = torch.tensor(labs, dtype=torch.long)
            attention[row, : len(ids)] = 1
        batches.append({"input_ids": input_ids, "attention_mask": attention, "labels": labels})
    return batches
