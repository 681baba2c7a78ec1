"""Weight-sync helpers: name checks, tied aliases, in-place copies; the NCCL path refuses on a
machine without CUDA and runs for real only on GPU hosts."""

import pytest
import torch

from training.weight_sync import (
    NCCLWeightSender,
    WeightSyncError,
    complete_named_tensors,
    copy_into_module,
    strip_wrapper_prefix,
    tied_aliases,
)


class TiedLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.head = torch.nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight
        self.norm = torch.nn.LayerNorm(3)


def test_wrapper_prefixes_are_stripped_however_deep():
    assert strip_wrapper_prefix("module._orig_mod.module.embed.weight") == "embed.weight"
    assert strip_wrapper_prefix("embed.module.weight") == "embed.module.weight"


def test_tied_parameters_are_found_and_filled_from_their_source():
    model = TiedLM()
    assert tied_aliases(model) == {"head.weight": "embed.weight"}
    weights = [(n, torch.ones_like(t)) for n, t in model.state_dict().items() if n != "head.weight"]
    completed = dict(complete_named_tensors(weights, model.state_dict(), tied_aliases(model)))
    assert torch.equal(completed["head.weight"], completed["embed.weight"])


def test_copy_into_module_converts_dtype_and_keeps_the_parameters_identity():
    model = TiedLM()
    embed_param = model.embed.weight
    new = {n: torch.full_like(t, 2.0, dtype=torch.float64) for n, t in model.state_dict().items()}
    copy_into_module(model, new.items())
    assert model.embed.weight is embed_param
    assert model.embed.weight.dtype == torch.float32
    assert torch.all(model.head.weight == 2.0)


def test_errors_name_unknown_and_missing_tensors():
    model = TiedLM()
    with pytest.raises(WeightSyncError) as error:
        copy_into_module(model, [("embed.weight", torch.zeros(5, 3)), ("extra", torch.zeros(1))])
    assert "unknown tensors ['extra']" in str(error.value)
    assert "missing tensors ['norm.bias', 'norm.weight']" in str(error.value)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA"
)
def test_nccl_sync_refuses_clearly_without_cuda():
    with pytest.raises(WeightSyncError, match="needs CUDA GPUs"):
        NCCLWeightSender(llm=object(), engine_world_size=1)
