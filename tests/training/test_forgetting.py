"""The measurable, non-flaky part of the forgetting experiment (bench/bench_forgetting.py),
through the run loop.

Held-out rewards of a tiny model after a few steps are too noisy to assert on; what EWC
guarantees is mechanical: with the same model, data and seed, a `training.run` on a new domain
whose spec carries the ``ewc`` section moves the parameters that mattered to the old domain
(Fisher-weighted) less than the same run without it.
"""

from __future__ import annotations

import pytest
import torch

from bench.bench_forgetting import (
    ForgettingConfig,
    HeldOut,
    anchor_at,
    distances,
    fisher_at,
    load_model,
    save_anchor,
    train_second_domain,
)
from training.models import ensure_demo_model

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def one_thread():
    # A 1.4M-parameter model gains nothing from a second thread, and loses many times over to
    # OpenMP spin-waiting when another process holds a core (bench_forgetting --threads).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _quiet(*args: object, **kwargs: object) -> None:
    pass


def test_a_run_with_ewc_keeps_the_old_domains_parameters_nearer_the_checkpoint(tmp_path):
    model_dir = ensure_demo_model()
    # Domain A only supplies the Fisher here; arithmetic needs no sandbox and has been a demo
    # domain since the start.
    config = ForgettingConfig(
        domains=("arithmetic", "json_format"),
        steps=2,
        lr=1e-3,
        prompts_per_step=8,
        group_size=4,
        # Hotter sampling breaks the JSON now and then: reward variance in most batches.
        temperature=1.5,
        eval_tasks=2,
        fisher_tasks=8,
    )
    held_out = HeldOut.draw(config)
    # Checkpoint A is the demo model itself: run 1 (training A) would only add minutes, and what
    # is under test is run 2 with and without the penalty.
    anchor = anchor_at(
        model_dir, held_out.fisher["arithmetic"], "arithmetic", strength=1000.0, seed=1
    )
    ewc_section = save_anchor(anchor, tmp_path / "ewc")

    moved = {}
    for label, ewc in (("plain", None), ("ewc", ewc_section)):
        phase = train_second_domain(
            config, held_out, model_dir, tmp_path / label, _quiet, label=label, ewc=ewc
        )
        moved[label] = distances(anchor, phase.model_dir)["fisher_distance"]

    # The penalty is 0 at the anchor, so it acts from the second update on.
    assert moved["plain"] > 0 and moved["ewc"] > 0, moved
    assert moved["ewc"] < 0.8 * moved["plain"], moved


def test_fisher_of_the_demo_model_covers_its_weights_and_is_normalised():
    model_dir = ensure_demo_model()
    config = ForgettingConfig(domains=("arithmetic", "json_format"), eval_tasks=4, fisher_tasks=4)
    fisher = fisher_at(model_dir, HeldOut.draw(config).fisher["arithmetic"], "arithmetic", seed=0)
    params = dict(load_model(model_dir).named_parameters())
    assert set(fisher) <= set(params)
    assert any("layers.0.self_attn" in name for name in fisher)
    flat = torch.cat([f.reshape(-1) for f in fisher.values()])
    assert bool((flat >= 0).all())
    # normalize="mean" over the entries that were kept
    assert float(flat.mean()) == pytest.approx(1.0, rel=1e-4)
