"""training.value_head: a scalar head on a real (tiny) Llama, saved beside the model."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from training.algorithms import compute_advantages, value_loss
from training.value_head import (
    VALUE_HEAD_DIR,
    CausalLMWithValueHead,
    ValueHead,
    load_value_head,
)


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def test_forward_gives_logits_and_one_value_per_position():
    model = CausalLMWithValueHead(tiny_llama())
    input_ids = torch.randint(0, 97, (3, 9))
    out = model(input_ids, attention_mask=torch.ones_like(input_ids))
    assert out.logits.shape == (3, 9, 97)
    assert out.values.shape == (3, 9)
    assert out.values.dtype == torch.float32
    # The LM's logits are unchanged by the head.
    plain = model.lm(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits
    assert torch.allclose(out.logits, plain)


def test_value_loss_trains_both_the_head_and_the_shared_trunk():
    model = CausalLMWithValueHead(tiny_llama())
    input_ids = torch.randint(0, 97, (2, 6))
    mask = torch.ones(2, 6)
    values = model(input_ids).values
    _, returns = compute_advantages(
        "gae",
        rewards=torch.tensor([1.0, 0.0]),
        response_mask=mask,
        values=values,
        gamma=1.0,
        lam=0.95,
    )
    loss, _ = value_loss(
        values=values,
        old_values=values.detach(),
        returns=returns,
        response_mask=mask,
        clip_range=None,
    )
    loss.backward()
    assert model.value_head.summary.weight.grad.abs().sum() > 0
    trunk_grad = model.lm.model.layers[0].mlp.up_proj.weight.grad
    assert trunk_grad is not None and trunk_grad.abs().sum() > 0


def test_save_and_load_keep_the_head_and_leave_the_model_directory_loadable(tmp_path):
    model = CausalLMWithValueHead(tiny_llama())
    with torch.no_grad():
        model.value_head.summary.bias.fill_(0.75)
    model.save_pretrained(tmp_path)
    assert (tmp_path / VALUE_HEAD_DIR / "config.json").exists()
    # The model's own weight files hold no value-head tensor (vLLM loads them as they are).
    assert not list(tmp_path.glob(f"*{VALUE_HEAD_DIR}*.safetensors"))

    input_ids = torch.randint(0, 97, (2, 5))
    model.eval()
    expected = model(input_ids)
    loaded = CausalLMWithValueHead.from_pretrained(tmp_path)
    loaded.eval()
    got = loaded(input_ids)
    assert torch.allclose(got.values, expected.values, atol=1e-6)
    assert torch.allclose(got.logits, expected.logits, atol=1e-5)
    plain = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    assert set(plain.state_dict()) == set(model.lm.state_dict())


def test_a_model_directory_without_a_head_gets_a_new_reproducible_one(tmp_path):
    tiny_llama().save_pretrained(str(tmp_path))
    assert load_value_head(tmp_path) is None
    first = CausalLMWithValueHead.from_pretrained(tmp_path, seed=3)
    second = CausalLMWithValueHead.from_pretrained(tmp_path, seed=3)
    assert torch.equal(first.value_head.summary.weight, second.value_head.summary.weight)
    assert float(first.value_head.summary.bias.detach().abs().sum()) == 0.0


def test_weight_sync_items_are_the_lm_tensors_under_their_own_names():
    model = CausalLMWithValueHead(tiny_llama())
    names = [name for name, _ in model.lm_state_items()]
    assert names == list(model.lm.state_dict())
    assert "lm_head.weight" in names
    assert not any(name.startswith(("lm.", "value_head")) for name in names)


def test_mismatched_or_corrupt_heads_are_refused(tmp_path):
    with pytest.raises(ValueError, match="hidden size 16, the model has 32"):
        CausalLMWithValueHead(tiny_llama(), ValueHead(16))
    (tmp_path / VALUE_HEAD_DIR).mkdir()
    (tmp_path / VALUE_HEAD_DIR / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="not a value-head config"):
        load_value_head(tmp_path)
    with pytest.raises(ValueError, match="expects hidden size 8"):
        ValueHead(8)(torch.zeros(1, 2, 4))
