"""Rollouts with ``transformers`` ``generate``: the fallback engine, and the reference the vLLM
engine is checked against.

Prompts (each repeated ``n`` times) are batched with left padding, in chunks of
``extra["max_batch_size"]`` sequences (default 64). Sampling with a seed forks the global RNG
(``torch.random.fork_rng``), so a rollout never disturbs the trainer's random state — exact
resume depends on that. Log-probabilities are those of the model's raw logits, before
temperature and top-p, as vLLM reports them by default (``logprobs_mode="raw_logprobs"``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from training.rollout.base import (
    EngineOptionError,
    RolloutEngineConfig,
    RolloutOutput,
    SamplingConfig,
)
from training.weight_sync import copy_into_module

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Options only vLLM implements; asking the fallback engine for them is an error, not a no-op.
_VLLM_ONLY = ("speculative", "quantization")


class HFEngine:
    """A ``transformers`` causal LM serving rollouts; see the module docstring."""

    def __init__(self, model_dir: str | Path, config: RolloutEngineConfig | None = None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        config = config or RolloutEngineConfig(engine="hf")
        refused = [name for name in _VLLM_ONLY if getattr(config, name)]
        if config.kv_cache_dtype != "auto":
            refused.append("kv_cache_dtype")
        # vLLM scheduler features: asking for them (true, or a token budget) and getting a
        # silent no-op would misreport what a run measured; "false" is what this engine does.
        refused += [
            name
            for name in (
                "enable_chunked_prefill",
                "enable_prefix_caching",
                "max_num_batched_tokens",
            )
            if getattr(config, name) not in (None, False)
        ]
        if config.weight_sync != "inprocess":
            refused.append("weight_sync")
        if refused:
            raise EngineOptionError(
                f"the transformers engine does not support {', '.join(refused)}; "
                "use engine='vllm' for these options (or leave them unset)"
            )
        self.config = config
        self.model_dir = Path(model_dir)
        self.device = torch.device(
            config.extra.get("device", "cuda" if torch.cuda.is_available() else "cpu")
        )
        self.max_batch_size = int(config.extra.get("max_batch_size", 64))
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        model: Any = AutoModelForCausalLM.from_pretrained(
            self.model_dir, dtype=_TORCH_DTYPES[config.dtype]
        )
        self.model: Any = model.to(torch.device(self.device)).eval()
        self.max_model_len = config.max_model_len or int(
            getattr(self.model.config, "max_position_embeddings", 2048)
        )
        self.policy_version = 0

    def generate(
        self, prompts: Sequence[str], sampling: SamplingConfig
    ) -> list[list[RolloutOutput]]:
        if isinstance(prompts, str):
            raise TypeError("prompts must be a sequence of strings, not one string")
        jobs = [(index, prompt) for index, prompt in enumerate(prompts) for _ in range(sampling.n)]
        results: list[list[RolloutOutput]] = [[] for _ in prompts]
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            for start in range(0, len(jobs), self.max_batch_size):
                chunk = jobs[start : start + self.max_batch_size]
                outputs = self._generate_batch([prompt for _, prompt in chunk], sampling)
                for (index, _), output in zip(chunk, outputs, strict=True):
                    results[index].append(output)
        return results

    @torch.no_grad()
    def _generate_batch(self, prompts: list[str], sampling: SamplingConfig) -> list[RolloutOutput]:
        tokenizer = self.tokenizer
        encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        too_long = [i for i, ids in enumerate(encoded) if len(ids) >= self.max_model_len]
        if too_long:
            raise ValueError(
                f"prompt {too_long[0]} has {len(encoded[too_long[0]])} tokens; "
                f"max_model_len is {self.max_model_len}"
            )
        width = max(len(ids) for ids in encoded)
        pad = tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in encoded])
        attention_mask = torch.tensor(
            [[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded]
        )
        max_new = min(sampling.max_new_tokens, self.max_model_len - width)
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_new,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": pad,
            "return_dict_in_generate": True,
            "output_logits": True,
        }
        if sampling.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(
                do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0
            )
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=tokenizer)
        if sampling.ignore_eos:
            kwargs["min_new_tokens"] = max_new
        out = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention_mask.to(self.device),
            **kwargs,
        )
        new_tokens = out.sequences[:, width:].cpu()
        # Raw logits of every step: [batch, steps, vocab] → log-probabilities of chosen tokens.
        logits = torch.stack(out.logits, dim=1).float().cpu()
        chosen = torch.log_softmax(logits, dim=-1).gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        outputs = []
        for row, prompt in enumerate(prompts):
            token_ids, logprobs, finish = self._cut(
                new_tokens[row].tolist(), chosen[row].tolist(), sampling
            )
            outputs.append(
                RolloutOutput(
                    prompt=prompt,
                    prompt_token_ids=encoded[row],
                    text=str(tokenizer.decode(token_ids, skip_special_tokens=True)),
                    token_ids=token_ids,
                    logprobs=logprobs,
                    finish_reason=finish,
                    policy_version=self.policy_version,
                )
            )
        return outputs

    def _cut(
        self, tokens: list[int], logprobs: list[float], sampling: SamplingConfig
    ) -> tuple[list[int], list[float], Any]:
        """Trim a generated row after its end: EOS (kept, as vLLM keeps it) or a stop string."""
        eos = None if sampling.ignore_eos else self.tokenizer.eos_token_id
        for position, token in enumerate(tokens):
            if token == eos:
                return tokens[: position + 1], logprobs[: position + 1], "stop"
            if sampling.stop:
                text = self.tokenizer.decode(tokens[: position + 1], skip_special_tokens=True)
                if any(stop in text for stop in sampling.stop):
                    return tokens[: position + 1], logprobs[: position + 1], "stop"
        return tokens, logprobs, "length"

    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        copy_into_module(self.model, named_tensors)
        self.policy_version = int(version)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def close(self) -> None:
        self.model = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
