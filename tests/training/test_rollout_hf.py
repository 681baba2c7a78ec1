"""The transformers rollout engine on the demo model: output shape, log-probabilities, seeds,
stop strings, live weight updates and refused options."""

import pytest
import torch

from tests.training.rollout_fixtures import demo_model_dir  # noqa: F401
from training.demo import get_domain
from training.rollout import (
    EngineOptionError,
    RolloutEngineConfig,
    SamplingConfig,
    make_engine,
)
from training.rollout.hf import HFEngine
from training.weight_sync import WeightSyncError


@pytest.fixture(scope="module")
def engine(demo_model_dir):  # noqa: F811
    engine = make_engine(RolloutEngineConfig(engine="hf"), demo_model_dir)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def prompts():
    tasks = get_domain("arithmetic").make_tasks(3, seed=0, split="held_out")
    tasks += get_domain("code").make_tasks(2, seed=0, split="held_out")
    return [t["prompt"] for t in tasks]


def test_outputs_are_grouped_per_prompt_with_n_samples(engine, prompts):
    results = engine.generate(prompts, SamplingConfig(n=3, max_new_tokens=12, seed=0))
    assert [len(group) for group in results] == [3] * len(prompts)
    for prompt, group in zip(prompts, results, strict=True):
        for output in group:
            assert output.prompt == prompt
            assert output.prompt_token_ids == engine.tokenizer(prompt)["input_ids"]
            assert 1 <= len(output.token_ids) <= 12
            assert len(output.logprobs) == len(output.token_ids)
            assert all(lp <= 0 for lp in output.logprobs)
            assert output.policy_version == 0
            if output.finish_reason == "stop":
                assert output.token_ids[-1] == engine.tokenizer.eos_token_id
            else:
                assert len(output.token_ids) == 12


def test_logprobs_are_the_models_own_for_the_chosen_tokens(engine, prompts):
    """Recompute with one unpadded forward pass: left padding must not change anything."""
    output = engine.generate(prompts[3:4], SamplingConfig(temperature=0.7, seed=5))[0][0]
    ids = torch.tensor([output.prompt_token_ids + output.token_ids])
    with torch.no_grad():
        logits = engine.model(ids).logits[0, len(output.prompt_token_ids) - 1 : -1]
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(output.token_ids)[:, None])
    assert output.logprobs == pytest.approx(expected.squeeze(-1).tolist(), abs=1e-4)


def test_a_seed_makes_sampling_reproducible_and_leaves_the_global_rng_alone(engine, prompts):
    sampling = SamplingConfig(n=2, max_new_tokens=10, seed=123)
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    first = engine.generate(prompts, sampling)
    after = torch.rand(1)
    assert before == after  # the rollout did not consume the trainer's random stream
    second = engine.generate(prompts, sampling)
    assert [[o.token_ids for o in g] for g in first] == [[o.token_ids for o in g] for g in second]


def test_greedy_is_batch_independent(engine, prompts):
    greedy = SamplingConfig(temperature=0, max_new_tokens=16)
    together = engine.generate(prompts, greedy)
    alone = [engine.generate([p], greedy)[0] for p in prompts]
    assert [g[0].token_ids for g in together] == [g[0].token_ids for g in alone]


def test_a_stop_string_ends_the_completion_and_is_kept(engine):
    prompt = get_domain("code").make_tasks(1, seed=0, split="train")[0]["prompt"]
    output = engine.generate([prompt], SamplingConfig(temperature=0, stop=("def",)))[0][0]
    assert output.finish_reason == "stop"
    assert output.text.endswith("def")
    assert output.text.count("def") == 1


def test_update_weights_serves_new_weights_and_bumps_the_version(demo_model_dir, prompts):  # noqa: F811
    engine = HFEngine(demo_model_dir)
    greedy = SamplingConfig(temperature=0, max_new_tokens=8)
    before = engine.generate(prompts, greedy)
    generator = torch.Generator().manual_seed(0)
    noisy = {
        name: tensor + 0.5 * torch.randn(tensor.shape, generator=generator)
        for name, tensor in engine.model.state_dict().items()
    }
    # DeepSpeed-style "module." prefixes are accepted; the tied lm_head may be left out.
    sent = [(f"module.{n}", t) for n, t in noisy.items() if n != "lm_head.weight"]
    engine.update_weights(sent, version=7)
    after = engine.generate(prompts, greedy)
    assert engine.policy_version == 7
    assert all(o.policy_version == 7 for g in after for o in g)
    assert [g[0].token_ids for g in after] != [g[0].token_ids for g in before]
    state = engine.model.state_dict()
    assert torch.equal(state["model.embed_tokens.weight"], noisy["model.embed_tokens.weight"])
    assert torch.equal(state["lm_head.weight"], noisy["model.embed_tokens.weight"])


def test_update_weights_refuses_unknown_or_missing_tensors_and_keeps_serving(
    demo_model_dir,  # noqa: F811
):
    engine = HFEngine(demo_model_dir)
    state = dict(engine.model.state_dict())
    snapshot = {k: v.clone() for k, v in state.items()}
    with pytest.raises(WeightSyncError, match="unknown tensors \\['model.bogus'\\]"):
        engine.update_weights([*state.items(), ("model.bogus", torch.zeros(1))], version=1)
    state.pop("model.norm.weight")
    with pytest.raises(WeightSyncError, match="missing tensors \\['model.norm.weight'\\]"):
        engine.update_weights(state.items(), version=1)
    wrong_shape = dict(snapshot, **{"model.norm.weight": torch.zeros(3)})
    with pytest.raises(WeightSyncError, match="model.norm.weight has shape"):
        engine.update_weights(wrong_shape.items(), version=1)
    assert engine.policy_version == 0
    for name, tensor in engine.model.state_dict().items():
        assert torch.equal(tensor, snapshot[name]), name


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"speculative": {"method": "ngram", "num_speculative_tokens": 2}}, "speculative"),
        ({"quantization": "fp8"}, "quantization"),
        ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype"),
        ({"weight_sync": "nccl"}, "weight_sync"),
        ({"enable_chunked_prefill": True}, "enable_chunked_prefill"),
        ({"enable_prefix_caching": True}, "enable_prefix_caching"),
        ({"max_num_batched_tokens": 2048}, "max_num_batched_tokens"),
    ],
)
def test_vllm_only_options_are_refused_by_name(demo_model_dir, options, named):  # noqa: F811
    with pytest.raises(EngineOptionError, match=named):
        make_engine(RolloutEngineConfig(engine="hf", **options), demo_model_dir)


def test_scheduler_features_turned_off_are_what_the_transformers_engine_does(
    demo_model_dir,  # noqa: F811
    engine,
    prompts,
):
    # "false" is accepted (it is what this engine does) and changes nothing it produces.
    turned_off = make_engine(
        RolloutEngineConfig(engine="hf", enable_chunked_prefill=False, enable_prefix_caching=False),
        demo_model_dir,
    )
    try:
        assert isinstance(turned_off, HFEngine)
        assert turned_off.config.enable_chunked_prefill is False
        assert turned_off.config.enable_prefix_caching is False
        greedy = SamplingConfig(temperature=0, max_new_tokens=8)
        produced = turned_off.generate(prompts[:2], greedy)
        expected = engine.generate(prompts[:2], greedy)
        assert [g[0].token_ids for g in produced] == [g[0].token_ids for g in expected]
        assert [g[0].logprobs for g in produced] == [
            pytest.approx(g[0].logprobs, abs=1e-5) for g in expected
        ]
    finally:
        turned_off.close()


def test_engine_config_names_every_bad_field():
    with pytest.raises(EngineOptionError) as error:
        RolloutEngineConfig.from_dict(
            {"engine": "tgi", "max_model_len": 0, "weight_sync": "carrier-pigeon", "nope": 1}
        )
    message = str(error.value)
    for field in ("engine:", "max_model_len:", "weight_sync:", "nope:"):
        assert field in message
    config = RolloutEngineConfig.from_dict({"engine": "vllm", "enable_prefix_caching": True})
    assert RolloutEngineConfig.from_dict(config.to_dict()) == config


def test_sampling_config_refuses_bad_values():
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0)
    with pytest.raises(ValueError, match="stop must be a sequence"):
        SamplingConfig(stop="</tool>")  # type: ignore[arg-type]


def test_make_engine_refuses_a_directory_without_a_model(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        make_engine(RolloutEngineConfig(), tmp_path)


def test_ignore_eos_generates_exactly_max_new_tokens(engine, prompts):
    [[output]] = engine.generate(
        prompts[:1], SamplingConfig(temperature=0, max_new_tokens=20, ignore_eos=True)
    )
    assert len(output.token_ids) == len(output.logprobs) == 20
    assert output.finish_reason == "length"
