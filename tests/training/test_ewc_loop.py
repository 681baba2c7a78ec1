"""EWC through the real run loop: a Fisher and an anchor saved by training.ewc, named by a run
spec, penalise the DeepSpeed-trained model from the first step that moves it."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.training.conftest import tiny_spec
from training.control import StaticControl
from training.ewc import EWCPenalty, causal_lm_nll, estimate_fisher, fisher_batches
from training.loop import run
from training.sink import ListSink
from training.spec import RunSpec

pytestmark = pytest.mark.slow


def test_a_run_spec_with_ewc_reports_a_penalty_that_grows_once_the_model_moves(
    tiny_model_dir, tmp_path
):
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    samples = [("What is 2 + 3?", "\\boxed{5}"), ("What is 9 - 4?", "\\boxed{5}")]
    fisher = estimate_fisher(
        model, fisher_batches(tokenizer, samples, batch_size=2), causal_lm_nll, normalize="mean"
    )
    penalty = EWCPenalty.from_model(model, fisher, strength=10.0)
    fisher_path, anchor_path = tmp_path / "fisher.pt", tmp_path / "anchor.pt"
    penalty.save_parts(fisher_path, anchor_path)

    spec = tiny_spec(
        tiny_model_dir,
        tmp_path,
        max_steps=2,
        ewc={"strength": 10.0, "fisher_path": str(fisher_path), "anchor_path": str(anchor_path)},
    )
    sink = ListSink()
    outcome = run(RunSpec.from_dict(spec), sink, StaticControl())
    assert outcome.status == "completed", outcome.error
    penalties = [values["ewc/penalty"] for _, values in sink.metric_rows if "ewc/penalty" in values]
    assert len(penalties) == 2
    # At the anchor the penalty is 0; after one optimiser step it is positive.
    assert penalties[0] == pytest.approx(0.0, abs=1e-12)
    assert penalties[1] > 0
