"""training.ewc: Fisher estimate, the penalty, and saving it with a checkpoint."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from training.ewc import (
    EWC_FILENAME,
    EWCPenalty,
    causal_lm_nll,
    estimate_fisher,
    fisher_batches,
)
from training.value_head import CausalLMWithValueHead

from .test_algorithms_value_head import tiny_llama


class Regression(nn.Module):
    """y = w . x + b with a Gaussian likelihood: gradients small enough to check by hand."""

    def __init__(self, weights: list[float], bias: float = 0.0) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(weights))
        self.b = nn.Parameter(torch.tensor(bias))
        self.unused = nn.Parameter(torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w + self.b


def regression_nll(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return 0.5 * (model(x) - y).square()


def test_fisher_is_the_mean_of_per_sample_squared_gradients():
    model = Regression([1.0, 2.0])
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    y = torch.tensor([0.0, 3.0, 2.0])
    # residuals r = w.x + b - y = [1, 1, 1]; grad_w = r * x, grad_b = r.
    fisher = estimate_fisher(model, [(x[:2], y[:2]), (x[2:], y[2:])], regression_nll)
    expected_w = (
        torch.tensor([1.0, 0.0]) + torch.tensor([0.0, 4.0]) + torch.tensor([1.0, 1.0])
    ) / 3
    torch.testing.assert_close(fisher["w"], expected_w)
    torch.testing.assert_close(fisher["b"], torch.tensor(1.0))
    # A parameter the likelihood never touches gets no entry (and so no penalty).
    assert "unused" not in fisher


def test_a_scalar_loss_counts_the_whole_batch_as_one_sample():
    model = Regression([1.0, 2.0])
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    y = torch.tensor([0.0, 3.0])
    fisher = estimate_fisher(model, [(x, y)], lambda m, b: regression_nll(m, b).sum())
    torch.testing.assert_close(fisher["w"], torch.tensor([1.0, 4.0]))
    torch.testing.assert_close(fisher["b"], torch.tensor(4.0))


def test_max_samples_and_normalisation():
    model = Regression([1.0, 2.0])
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [5.0, 5.0]])
    y = torch.tensor([0.0, 3.0, 0.0])
    fisher = estimate_fisher(model, [(x, y)], regression_nll, max_samples=2)
    torch.testing.assert_close(fisher["w"], torch.tensor([0.5, 2.0]))
    normalised = estimate_fisher(model, [(x, y)], regression_nll, normalize="mean")
    flat = torch.cat([f.reshape(-1) for f in normalised.values()])
    assert float(flat.mean()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="normalize must be"):
        estimate_fisher(model, [(x, y)], regression_nll, normalize="sum")
    with pytest.raises(ValueError, match="no samples"):
        estimate_fisher(model, [], regression_nll)


def test_estimating_the_fisher_leaves_grads_and_training_mode_alone():
    model = Regression([1.0, 2.0])
    model.train()
    model.w.grad = torch.tensor([7.0, 7.0])
    estimate_fisher(model, [(torch.ones(2, 2), torch.zeros(2))], regression_nll)
    assert model.training
    assert model.w.grad.tolist() == [7.0, 7.0]
    assert model.b.grad is None


def test_penalty_is_zero_at_the_anchor_and_quadratic_away_from_it():
    model = Regression([1.0, 2.0], bias=0.5)
    fisher = {"w": torch.tensor([2.0, 0.0]), "b": torch.tensor(1.0)}
    penalty = EWCPenalty.from_model(model, fisher, strength=3.0)
    assert float(penalty(model).detach()) == 0.0
    with torch.no_grad():
        model.w.add_(torch.tensor([0.5, 10.0]))  # the second weight has zero Fisher: free
        model.b.sub_(1.0)
    # 3/2 * (2 * 0.25 + 0 * 100 + 1 * 1) = 2.25
    assert float(penalty(model).detach()) == pytest.approx(2.25)


def test_penalty_gradient_pulls_parameters_back_to_the_anchor():
    model = Regression([1.0, 2.0])
    penalty = EWCPenalty.from_model(model, {"w": torch.tensor([1.0, 4.0])}, strength=0.5)
    with torch.no_grad():
        model.w.copy_(torch.tensor([2.0, 1.0]))
    penalty(model).backward()
    # d/dw = strength * F * (w - anchor) = 0.5 * [1, 4] * [1, -1]
    assert model.w.grad.tolist() == pytest.approx([0.5, -2.0])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    before = penalty.anchor_distance(model)
    optimizer.step()
    assert penalty.anchor_distance(model) < before


def test_ewc_keeps_what_the_first_task_needed_when_training_a_second():
    """Task A needs w0, task B only w1 ... but B's data also pushes w0 away; EWC holds w0."""
    torch.manual_seed(0)
    x_a = torch.stack([torch.randn(64), torch.zeros(64)], dim=1)
    y_a = 2.0 * x_a[:, 0]
    x_b = torch.randn(64, 2)
    y_b = -1.0 * x_b[:, 0] + 3.0 * x_b[:, 1]

    def train(model: Regression, penalty: EWCPenalty | None) -> None:
        optimizer = torch.optim.SGD([model.w, model.b], lr=0.05)
        for _ in range(200):
            optimizer.zero_grad()
            loss = regression_nll(model, (x_b, y_b)).mean()
            if penalty is not None:
                loss = loss + penalty(model)
            loss.backward()
            optimizer.step()

    def task_a_error(model: Regression) -> float:
        return float(regression_nll(model, (x_a, y_a)).mean().detach())

    def sampled_nll(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        # The true Fisher: targets drawn from the model's own predictive distribution, since
        # a model that fits task A exactly has zero empirical gradients.
        x, _ = batch
        prediction = model(x)
        target = prediction.detach() + torch.randn(prediction.shape)
        return 0.5 * (prediction - target).square()

    after_a = Regression([2.0, 0.0])
    fisher = estimate_fisher(after_a, [(x_a, y_a)], sampled_nll, normalize="max")
    # x_a's second feature is 0: task A says nothing about w1.
    assert float(fisher["w"][1]) == 0.0

    plain = Regression([2.0, 0.0])
    train(plain, None)
    protected = Regression([2.0, 0.0])
    penalty = EWCPenalty.from_model(protected, fisher, strength=10.0)
    train(protected, penalty)

    assert penalty.anchor_distance(protected, weighted=True) < 0.2 * penalty.anchor_distance(
        plain, weighted=True
    )
    assert task_a_error(protected) < 0.2 * task_a_error(plain)
    # w1 was free to learn task B under EWC too.
    assert float(protected.w[1].detach()) == pytest.approx(3.0, abs=0.3)


def test_fisher_on_an_lm_with_a_value_head_has_lm_entries_only(tmp_path):
    model = CausalLMWithValueHead(tiny_llama())
    batches = [
        {
            "input_ids": torch.randint(0, 97, (2, 7)),
            "attention_mask": torch.ones(2, 7, dtype=torch.long),
            "labels": torch.cat([torch.full((2, 3), -100), torch.randint(0, 97, (2, 4))], dim=1),
        }
    ]
    fisher = estimate_fisher(model, batches, causal_lm_nll)
    params = dict(model.named_parameters())
    assert fisher
    assert all(name.startswith("lm.") for name in fisher)
    for name, value in fisher.items():
        assert value.shape == params[name].shape
        assert bool((value >= 0).all())
    assert sum(float(v.sum()) for v in fisher.values()) > 0

    penalty = EWCPenalty.from_model(model, fisher, strength=1.0, info={"domains": ["arith"]})
    assert float(penalty(model).detach()) == 0.0
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.01)
    assert float(penalty(model).detach()) > 0

    saved = penalty.save(tmp_path)
    assert saved.name == EWC_FILENAME
    loaded = EWCPenalty.load(tmp_path)
    assert loaded.info == {"domains": ["arith"]} and loaded.strength == 1.0
    assert float(loaded(model).detach()) == pytest.approx(float(penalty(model).detach()))
    assert EWCPenalty.load(saved, strength=4.0).strength == 4.0


def test_causal_lm_nll_scores_only_the_completion_tokens():
    model = tiny_llama()
    input_ids = torch.randint(0, 97, (1, 8))
    labels = input_ids.clone()
    labels[:, :5] = -100
    nll = causal_lm_nll(model, {"input_ids": input_ids, "labels": labels})
    hf_mean = model(input_ids=input_ids, labels=labels).loss
    # HF averages over the 3 scored tokens; causal_lm_nll sums them.
    assert float(nll.detach()) == pytest.approx(3 * float(hf_mean.detach()), rel=1e-5)


def test_fisher_batches_pad_right_and_mask_the_prompt():
    class CharTokenizer:
        pad_token_id = 0
        eos_token_id = 1

        def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
            ids = [ord(c) % 50 + 2 for c in text]
            return {"input_ids": ([1] if add_special_tokens else []) + ids}

    batches = fisher_batches(CharTokenizer(), [("ab", "c"), ("a", "bcd"), ("x", "y")], batch_size=2)
    assert [b["input_ids"].shape for b in batches] == [(2, 5), (1, 3)]
    first = batches[0]
    assert first["labels"][0].tolist() == [-100, -100, -100, ord("c") % 50 + 2, -100]
    assert first["attention_mask"][0].tolist() == [1, 1, 1, 1, 0]
    assert first["input_ids"][0, -1] == 0


def test_bad_penalties_are_refused(tmp_path):
    model = Regression([1.0, 2.0])
    with pytest.raises(ValueError, match="strength must be"):
        EWCPenalty.from_model(model, {"w": torch.ones(2)}, strength=-1.0)
    with pytest.raises(ValueError, match="must be finite and >= 0"):
        EWCPenalty({"w": torch.tensor([-1.0, 0.0])}, {"w": torch.zeros(2)}, strength=1.0)
    with pytest.raises(ValueError, match="Fisher shape"):
        EWCPenalty({"w": torch.ones(3)}, {"w": torch.zeros(2)}, strength=1.0)
    penalty = EWCPenalty({"encoder.w": torch.ones(2)}, {"encoder.w": torch.zeros(2)}, strength=1.0)
    with pytest.raises(ValueError, match="same module you penalise"):
        penalty(model)
    (tmp_path / "junk.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(Exception):  # noqa: B017 - safetensors raises its own error type
        EWCPenalty.load(tmp_path / "junk.safetensors")


def test_zero3_partitioned_parameters_are_refused_with_a_clear_message():
    model = Regression([1.0, 2.0])
    # What DeepSpeed ZeRO-3 leaves on a module: an empty local tensor and the full size aside.
    model.w.data = torch.empty(0)
    model.w.ds_numel = 2  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="partitioned by ZeRO-3"):
        estimate_fisher(model, [(torch.ones(1, 2), torch.zeros(1))], regression_nll)


def test_a_fisher_from_the_bare_lm_applies_to_the_lm_inside_a_value_head_wrapper(tmp_path):
    lm = tiny_llama()
    batch = {
        "input_ids": torch.randint(0, 97, (2, 6)),
        "labels": torch.randint(0, 97, (2, 6)),
    }
    fisher = estimate_fisher(lm, [batch], causal_lm_nll)
    assert not any(name.startswith("lm.") for name in fisher)
    penalty = EWCPenalty.from_model(lm, fisher, strength=2.0)
    wrapped = CausalLMWithValueHead(lm)
    with torch.no_grad():
        lm.model.norm.weight.add_(0.5)
        wrapped.value_head.summary.weight.add_(100.0)  # not in the Fisher: never penalised
    assert float(penalty(wrapped).detach()) == pytest.approx(float(penalty(lm).detach()))
    assert float(penalty(lm).detach()) > 0


def test_fisher_and_anchor_files_named_by_a_run_spec_load_into_a_penalty(tmp_path):
    model = Regression([1.0, 2.0])
    penalty = EWCPenalty.from_model(model, {"w": torch.tensor([1.0, 3.0])}, strength=2.0)
    for suffix in (".pt", ".safetensors"):
        fisher_path, anchor_path = tmp_path / f"fisher{suffix}", tmp_path / f"anchor{suffix}"
        penalty.save_parts(fisher_path, anchor_path)
        loaded = EWCPenalty.from_paths(fisher_path, anchor_path, strength=2.0)
        with torch.no_grad():
            model.w.add_(1.0)
        assert float(loaded(model).detach()) == pytest.approx(float(penalty(model).detach()))
    single = penalty.save(tmp_path / "both.safetensors")
    assert EWCPenalty.from_paths(single, None, strength=5.0).strength == 5.0
    torch.save({"w": [1, 2]}, tmp_path / "bad.pt")
    with pytest.raises(Exception):  # noqa: B017 - torch refuses non-tensor payloads or we do
        EWCPenalty.from_paths(tmp_path / "bad.pt", tmp_path / "anchor.pt", strength=1.0)
