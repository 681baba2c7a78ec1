"""A scalar value head on a causal LM's last hidden state, for PPO with GAE.

``CausalLMWithValueHead`` wraps a Hugging Face causal LM: one forward pass gives the policy's
logits and a value per position, so the actor and the critic share the trunk (one model to
train, shard and checkpoint). The head is saved *beside* the model, in a ``value_head/``
sub-directory of the model directory, never inside the model's own weight files: vLLM and
``transformers`` load the directory exactly as before and ignore the head, and a directory
without a head loads with a freshly initialised one.

Alignment: ``values[:, i]`` is the value of the prefix ending at token ``i``, i.e. of the state
in which token ``i + 1`` is generated, the same position whose logits score token ``i + 1``.
Slice values exactly like the logits that give the response log-probabilities.

Weight sync to a rollout engine must send the LM's tensors only: use ``lm_state_items()``,
which yields them under the LM's own names (no ``lm.`` prefix, no value head).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

__all__ = [
    "VALUE_HEAD_DIR",
    "CausalLMWithValueHead",
    "ValueHead",
    "ValueHeadOutput",
    "load_value_head",
    "save_value_head",
]

VALUE_HEAD_DIR = "value_head"
_WEIGHTS = "value_head.safetensors"
_CONFIG = "config.json"
_FORMAT_VERSION = 1


class ValueHead(nn.Module):
    """``Linear(hidden_size, 1)`` (after optional dropout); returns float32 ``[batch, tokens]``."""

    def __init__(self, hidden_size: int, *, dropout: float = 0.0) -> None:
        super().__init__()
        if hidden_size <= 0:
            raise ValueError(f"hidden_size must be positive, got {hidden_size}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.hidden_size = hidden_size
        self.dropout_p = dropout
        self.dropout = nn.Dropout(dropout)
        self.summary = nn.Linear(hidden_size, 1)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Small weights and a zero bias: the first values are near 0 rather than arbitrary,
        # so the first GAE advantages are close to the plain returns.
        nn.init.normal_(self.summary.weight, std=1.0 / math.sqrt(self.hidden_size + 1))
        nn.init.zeros_(self.summary.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if hidden_states.shape[-1] != self.hidden_size:
            raise ValueError(
                f"value head expects hidden size {self.hidden_size}, got {hidden_states.shape[-1]}"
            )
        hidden = self.dropout(hidden_states.to(self.summary.weight.dtype))
        return self.summary(hidden).squeeze(-1).float()

    def config(self) -> dict[str, Any]:
        return {
            "format_version": _FORMAT_VERSION,
            "hidden_size": self.hidden_size,
            "dropout": self.dropout_p,
        }


@dataclass
class ValueHeadOutput:
    logits: torch.Tensor  # [batch, tokens, vocab]
    values: torch.Tensor  # [batch, tokens], float32


def save_value_head(head: ValueHead, model_dir: str | Path) -> Path:
    """Writes the head to ``model_dir/value_head/`` and returns that directory."""
    target = Path(model_dir) / VALUE_HEAD_DIR
    target.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().cpu().contiguous() for name, t in head.state_dict().items()}
    save_file(tensors, str(target / _WEIGHTS))
    (target / _CONFIG).write_text(json.dumps(head.config(), indent=2) + "\n")
    return target


def load_value_head(model_dir: str | Path) -> ValueHead | None:
    """The head saved under ``model_dir``, or ``None`` when the directory has none."""
    source = Path(model_dir) / VALUE_HEAD_DIR
    config_path = source / _CONFIG
    if not config_path.exists():
        return None
    try:
        config = json.loads(config_path.read_text())
        hidden_size = int(config["hidden_size"])
        dropout = float(config.get("dropout", 0.0))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{config_path}: not a value-head config ({exc})") from exc
    if config.get("format_version", _FORMAT_VERSION) > _FORMAT_VERSION:
        raise ValueError(f"{config_path}: written by a newer version of this code")
    head = ValueHead(hidden_size, dropout=dropout)
    state = load_file(str(source / _WEIGHTS))
    missing, unexpected = head.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{source / _WEIGHTS}: missing tensors {missing}, unexpected tensors {unexpected}"
        )
    return head


class CausalLMWithValueHead(nn.Module):
    """A causal LM plus a ``ValueHead`` on its last hidden state.

    ``forward(input_ids, attention_mask=None, **kwargs)`` returns ``ValueHeadOutput``. Extra
    keyword arguments go to the LM (``position_ids`` for packed sequences, for instance).
    """

    def __init__(self, lm: nn.Module, value_head: ValueHead | None = None) -> None:
        super().__init__()
        hidden_size = _hidden_size(lm)
        if value_head is None:
            value_head = ValueHead(hidden_size)
        elif value_head.hidden_size != hidden_size:
            raise ValueError(
                f"value head was built for hidden size {value_head.hidden_size}, "
                f"the model has {hidden_size}"
            )
        self.lm = lm
        # Keep the head in the LM's dtype and device so DeepSpeed sees one uniform module.
        first = next(lm.parameters(), None)
        if first is not None:
            value_head = value_head.to(device=first.device, dtype=first.dtype)
        self.value_head = value_head

    @property
    def config(self) -> Any:
        return getattr(self.lm, "config", None)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> ValueHeadOutput:
        # hidden_states[-1] is the final layer's output after the final norm in HF decoders;
        # the layer activations it holds are kept for backward anyway, so asking for them costs
        # little memory.
        out = self.lm(
            input_ids=input_ids,
            attention_mask=attention_mask,
            output_hidden_states=True,
            use_cache=False,
            **kwargs,
        )
        values = self.value_head(out.hidden_states[-1])
        return ValueHeadOutput(logits=out.logits, values=values)

    def lm_state_items(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The LM's tensors under its own names, for weight sync to a rollout engine."""
        yield from self.lm.state_dict().items()

    def save_pretrained(self, model_dir: str | Path, **kwargs: Any) -> None:
        """Saves the LM in Hugging Face format and the head under ``value_head/``."""
        save = getattr(self.lm, "save_pretrained", None)
        if save is None:
            raise TypeError(f"{type(self.lm).__name__} has no save_pretrained")
        save(str(model_dir), **kwargs)
        save_value_head(self.value_head, model_dir)

    @classmethod
    def from_pretrained(
        cls, model_dir: str | Path, *, seed: int | None = None, **kwargs: Any
    ) -> CausalLMWithValueHead:
        """Loads the LM with ``AutoModelForCausalLM`` and the head if saved there; otherwise a
        new head (initialised from ``seed`` when given, so runs are reproducible)."""
        from transformers import AutoModelForCausalLM

        lm = AutoModelForCausalLM.from_pretrained(str(model_dir), **kwargs)
        head = load_value_head(model_dir)
        if head is None:
            head = ValueHead(_hidden_size(lm))
            if seed is not None:
                generator = torch.Generator().manual_seed(seed)
                std = 1.0 / math.sqrt(head.hidden_size + 1)
                with torch.no_grad():
                    head.summary.weight.copy_(
                        torch.randn(head.summary.weight.shape, generator=generator) * std
                    )
        return cls(lm, head)


def _hidden_size(lm: nn.Module) -> int:
    config = getattr(lm, "config", None)
    for attribute in ("hidden_size", "n_embd", "d_model"):
        value = getattr(config, attribute, None)
        if isinstance(value, int) and value > 0:
            return value
    get_text_config = getattr(config, "get_text_config", None)
    if callable(get_text_config):
        value = getattr(get_text_config(), "hidden_size", None)
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError(f"cannot tell the hidden size of {type(lm).__name__} from its config")
