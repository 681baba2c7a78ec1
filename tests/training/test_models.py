"""The demo model: reproducible from its seed, cached, loadable as a plain Hugging Face
directory, and a base that solves some held-out tasks but not all."""

import json

import pytest
import torch
from safetensors.torch import load_file

import rewards
import training.models as models
from tests.training.rollout_fixtures import demo_model_dir  # noqa: F401
from training.demo import demo_domains
from training.rollout import SamplingConfig
from training.rollout.hf import HFEngine

# A model small enough to build twice in a test: the recipe is the same code path as "test".
TINY = models.DemoModelSize(
    hidden_size=64,
    num_layers=1,
    intermediate_size=128,
    vocab_size=320,
    warmup_steps=3,
    batch_size=4,
    learning_rate=1e-3,
)


@pytest.fixture
def tiny_size(monkeypatch):
    monkeypatch.setitem(models.SIZES, "tiny", TINY)
    monkeypatch.setattr(models, "EVAL_PER_DOMAIN", 1)
    return "tiny"


def test_the_same_seed_builds_the_same_bits_and_another_seed_does_not(tmp_path, tiny_size):
    torch.manual_seed(1234)
    before = torch.rand(1)
    torch.manual_seed(1234)
    first = models.ensure_demo_model(tmp_path / "a", size=tiny_size, seed=7)
    assert torch.rand(1) == before  # building left the caller's random stream alone
    second = models.build_demo_model(tmp_path / "b", size=tiny_size, seed=7)
    other = models.ensure_demo_model(tmp_path / "c", size=tiny_size, seed=8)
    a, b = load_file(first / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (first / "tokenizer.json").read_text() == (tmp_path / "b/tokenizer.json").read_text()
    c = load_file(other / "model.safetensors")
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    assert second["settings"]["seed"] == 7


def test_a_cpu_with_other_vector_units_builds_the_same_bits(tmp_path, tiny_size, monkeypatch):
    """MKL picks AVX2 or AVX-512 matrix kernels by CPU, and they round differently (the base
    built on an AVX-512 Xeon scored otherwise than on the machine where the tests were written).
    The build's portable numerics make the choice not matter: emulated here by capping MKL at
    AVX2, as on a CPU without AVX-512, which without them changes the bits of the products on
    any CPU that has it."""
    here = models.build_demo_model(tmp_path / "here", size=tiny_size, seed=7)
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    avx2 = models.build_demo_model(tmp_path / "avx2", size=tiny_size, seed=7)
    assert here["settings"] == avx2["settings"]
    a = load_file(tmp_path / "here" / "model.safetensors")
    b = load_file(tmp_path / "avx2" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_cpu_without_avx2_is_not_pinned_to_avx2_kernels(monkeypatch):
    """ATen trusts ATEN_CPU_CAPABILITY=avx2: pinned on a CPU without AVX2 its kernels would die
    of SIGILL. Such a CPU keeps the thread pins only; one with AVX2 and FMA gets them all."""
    monkeypatch.setattr(models, "_cpu_flags", lambda: {"sse2", "avx"})
    env = models.portable_numerics_env()
    assert "ATEN_CPU_CAPABILITY" not in env and "MKL_CBWR" not in env
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1"
    monkeypatch.setattr(models, "_cpu_flags", lambda: {"sse2", "avx", "avx2", "fma"})
    assert models.portable_numerics_env() == models.PORTABLE_NUMERICS_ENV


def test_a_relative_target_is_the_callers_not_the_repositorys(tmp_path, tiny_size, monkeypatch):
    """The build's child runs in the repository root: a relative target still means the
    caller's directory."""
    monkeypatch.chdir(tmp_path)
    record = models.build_demo_model("rel", size=tiny_size, seed=7)
    assert record["settings"]["seed"] == 7
    assert (tmp_path / "rel" / models.BUILD_RECORD).is_file()
    assert not (models.REPO_ROOT / "rel").exists()


def test_a_failed_build_says_why_and_leaves_nothing(tmp_path, tiny_size, monkeypatch):
    monkeypatch.setitem(
        models.SIZES, "tiny", models.DemoModelSize(**{**TINY.__dict__, "learning_rate": -1.0})
    )
    with pytest.raises(RuntimeError, match="building the demo model failed"):
        models.build_demo_model(tmp_path / "bad", size=tiny_size)
    assert list(tmp_path.iterdir()) == []


def test_a_cached_model_is_reused_and_a_stale_one_rebuilt(tmp_path, tiny_size):
    path = models.ensure_demo_model(tmp_path / "m", size=tiny_size)
    record = path / models.BUILD_RECORD
    stamp = record.stat().st_mtime_ns
    assert models.ensure_demo_model(path, size=tiny_size) == path
    assert record.stat().st_mtime_ns == stamp
    stale = json.loads(record.read_text())
    stale["settings"]["recipe"] = -1
    record.write_text(json.dumps(stale))
    models.ensure_demo_model(path, size=tiny_size)
    assert json.loads(record.read_text())["settings"]["recipe"] == models.RECIPE_VERSION


def test_the_command_line_builds_then_reports_up_to_date(tmp_path, tiny_size, capsys):
    out = tmp_path / "cli"
    assert models.main(["make-demo", "--size", tiny_size, "--out", str(out)]) == 0
    assert (out / "config.json").is_file()
    assert models.main(["make-demo", "--size", tiny_size, "--out", str(out)]) == 0
    assert "up to date" in capsys.readouterr().out


def test_unknown_sizes_are_refused():
    with pytest.raises(ValueError, match="unknown demo model size 'huge'"):
        models.ensure_demo_model(size="huge")


def test_the_demo_model_is_llama_shaped_with_64_wide_heads(demo_model_dir):  # noqa: F811
    config = json.loads((demo_model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["hidden_size"] // config["num_attention_heads"] == 64
    assert config["tie_word_embeddings"] is True


@pytest.mark.slow
def test_the_base_solves_some_held_out_tasks_but_not_all(demo_model_dir, closing):  # noqa: F811
    """Greedy answers to 16 held-out tasks per domain, scored by the domains' real rubrics."""
    engine = HFEngine(demo_model_dir)
    means = {}
    for domain in demo_domains():
        tasks = domain.make_tasks(16, seed=5, split="held_out")
        outputs = engine.generate(
            [t["prompt"] for t in tasks],
            SamplingConfig(temperature=0, max_new_tokens=domain.max_new_tokens),
        )
        rubric = rewards.Rubric.from_spec(domain.rubric_spec)
        # Code rubrics hold zygote sandboxes until closed.
        closing.append(rubric)
        totals = [
            rubric.score(
                rewards.Sample(
                    domain=domain.name,
                    prompt=t["prompt"],
                    completion=o[0].text,
                    ground_truth=t["ground_truth"],
                    metadata=t["metadata"],
                )
            ).total
            for t, o in zip(tasks, outputs, strict=True)
        ]
        means[domain.name] = sum(totals) / len(totals)
    overall = sum(means.values()) / len(means)
    assert 0.15 <= overall <= 0.75, means
    assert max(means.values()) > 0.3, means  # at least one domain is already partly solved
