"""Reward models, LLM judges, meshes, installed user functions, terminal check scripts."""

from __future__ import annotations

import pytest

from rewards import Rubric, RubricSpecError, Sample
from rewards.criteria.user import detect_signature
from tests.rewards import reward_functions
from tests.rewards.conftest import one_criterion, sample

FUNCTIONS = "tests.rewards.reward_functions"

# --- user functions by dotted path -------------------------------------------------------------


def test_signatures_are_detected():
    assert detect_signature(reward_functions.compute_score) == "verl"
    assert detect_signature(reward_functions.compute_score_three) == "verl"
    assert detect_signature(reward_functions.reward_func) == "trl"
    with pytest.raises(ValueError, match="neither verl"):
        detect_signature(reward_functions.wrong_signature)


def test_a_verl_compute_score_is_called_unchanged_and_its_dict_kept(scorer):
    score = scorer("python_function", {"function": f"{FUNCTIONS}:compute_score"})
    value, details = score("the answer is 42", "42", domain="gsm8k")
    assert value == 1.0
    assert details["signature"] == "verl" and details["source"] == "gsm8k"
    three = scorer("python_function", {"function": f"{FUNCTIONS}.compute_score_three"})
    assert three("x")[0] == 0.25


def test_a_trl_reward_func_gets_lists_and_metadata_columns(scorer):
    assert scorer("python_function", {"function": f"{FUNCTIONS}:reward_func"})("12345")[0] == 0.5
    column = scorer("python_function", {"function": f"{FUNCTIONS}:reward_with_column"})
    assert column("it is 7", metadata={"answer": 7})[0] == 1.0
    assert column("it is 8", metadata={"answer": 7})[0] == 0.0


def test_a_trl_function_on_chat_samples_gets_messages():
    rubric = Rubric.from_spec(
        one_criterion("python_function", {"function": f"{FUNCTIONS}:reward_func"})
    )
    chat = Sample(domain="d", prompt=[{"role": "user", "content": "hi"}],
                  messages=[{"role": "user", "content": "hi"},
                            {"role": "assistant", "content": "1234567890"}])  # fmt: skip
    assert rubric.score(chat).total == 1.0


def test_not_applicable_scores_zero_and_says_so(scorer):
    value, details = scorer("python_function", {"function": f"{FUNCTIONS}:not_applicable"})("x")
    assert value == 0.0 and details["applicable"] is False


def test_a_function_with_another_signature_is_refused_when_building():
    with pytest.raises(RubricSpecError, match="neither verl"):
        Rubric.from_spec(
            one_criterion("python_function", {"function": f"{FUNCTIONS}:wrong_signature"})
        )


# --- LLM judge ----------------------------------------------------------------------------------


class ScriptedJudge:
    def __init__(self, answers):
        self.answers = list(answers)
        self.prompts = []

    def generate(self, prompts, *, max_tokens, temperature):
        self.prompts.extend(prompts)
        return [self.answers.pop(0) for _ in prompts]


def test_the_judge_prompt_carries_the_rubric_and_the_score_is_normalised():
    judge = ScriptedJudge(["Good work.\nFINAL SCORE: 7", "FINAL SCORE: 9"])
    spec = one_criterion(
        "llm_judge", {"engine": "j", "rubric": "Reward clear proofs.", "samples": 2}
    )
    result = Rubric.from_spec(spec, resources={"j": judge}).score(sample("proof...", "QED"))
    assert result.total == pytest.approx(0.8)
    assert "Reward clear proofs." in judge.prompts[0] and "proof..." in judge.prompts[0]


def test_a_judge_without_a_score_gives_zero_and_a_plain_callable_works():
    spec = one_criterion("llm_judge", {"engine": "j", "rubric": "r", "low": 1, "high": 5})
    rubric = Rubric.from_spec(spec, resources={"j": lambda prompt: "Rating: excellent"})
    assert rubric.score(sample("x")).details["c"]["reason"] == "the judge gave no score"
    rubric = Rubric.from_spec(spec, resources={"j": lambda prompt: "FINAL SCORE: 99"})
    assert rubric.score(sample("x")).total == 1.0  # clipped to the scale


def test_a_missing_judge_engine_is_a_spec_issue():
    with pytest.raises(RubricSpecError) as caught:
        Rubric.from_spec(one_criterion("llm_judge", {"engine": "nowhere", "rubric": "r"}))
    assert caught.value.issues[0].path == "criteria[0].params.engine"


# --- reward model ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_reward_model(tmp_path_factory):
    """A tiny BERT-shaped classifier with a tokenizer trained here: nothing downloaded."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    directory = tmp_path_factory.mktemp("reward-model")
    raw = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    raw.train_from_iterator(["good answer bad answer the task is done well poorly"] * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]",
    )  # fmt: skip
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, num_labels=1,
                        max_position_embeddings=64)  # fmt: skip
    model = BertForSequenceClassification(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory, tokenizer, model


@pytest.mark.slow
def test_a_local_reward_model_scores_with_its_own_logit(tiny_reward_model, scorer):
    import torch

    directory, tokenizer, model = tiny_reward_model
    score = scorer("reward_model", {"path": str(directory), "device": "cpu"})
    good, details = score("good answer", prompt="the task")
    bad, _ = score("bad answer poorly", prompt="the task")
    with torch.inference_mode():
        expected = model.eval()(**tokenizer("the task", "good answer", return_tensors="pt")).logits
    assert good == pytest.approx(float(expected[0, 0]), abs=1e-5)
    assert good != bad
    squashed = scorer("reward_model", {"path": str(directory), "transform": "sigmoid"})
    assert 0 < squashed("good answer", prompt="the task")[0] < 1
    assert details["tokens"] > 2


def test_a_missing_reward_model_scores_zero_with_the_reason(scorer, tmp_path):
    value, details = scorer("reward_model", {"path": str(tmp_path / "absent")})("x")
    assert value == 0.0 and "cannot load reward model" in details["error"]


@pytest.mark.gpu
def test_the_reward_model_runs_on_cuda_when_asked(tiny_reward_model, scorer):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine")
    directory, _, _ = tiny_reward_model
    assert scorer("reward_model", {"path": str(directory), "device": "cuda"})("good answer")[1]


# --- meshes ----------------------------------------------------------------------------------

CUBE_VERTICES = [(0, 0, 0), (1, 0, 0), (1, 1, 0), (0, 1, 0), (0, 0, 1), (1, 0, 1), (1, 1, 1),
                 (0, 1, 1)]  # fmt: skip
CUBE_FACES = [(1, 3, 2), (1, 4, 3), (5, 6, 7), (5, 7, 8), (1, 2, 6), (1, 6, 5), (2, 3, 7),
              (2, 7, 6), (3, 4, 8), (3, 8, 7), (4, 1, 5), (4, 5, 8)]  # fmt: skip


def obj(vertices, faces, scale=1.0) -> str:
    lines = [f"v {x * scale} {y * scale} {z * scale}" for x, y, z in vertices]
    lines += [f"f {a} {b} {c}" for a, b, c in faces]
    return "```obj\n" + "\n".join(lines) + "\n```"


def test_a_closed_cube_passes_every_mesh_check(scorer):
    value, details = scorer("mesh", {"max_extent": [2, 2, 2], "max_faces": 20})(
        obj(CUBE_VERTICES, CUBE_FACES)
    )
    assert value == 1.0 and details["faces"] == 12


def test_an_open_box_is_not_watertight_and_a_big_one_is_out_of_bounds(scorer):
    score = scorer("mesh", {"max_extent": [2, 2, 2]})
    value, details = score(obj(CUBE_VERTICES, CUBE_FACES[2:]))
    assert details["checks"]["watertight"] is False and details["checks"]["manifold"] is False
    assert value < 1
    value, details = score(obj(CUBE_VERTICES, CUBE_FACES, scale=5))
    assert details["checks"]["bounds"] is False


def test_degenerate_faces_and_stl_text(scorer):
    vertices = [*CUBE_VERTICES, (2, 2, 2)]
    value, details = scorer("mesh", {"checks": ["no_degenerate_faces"]})(
        obj(vertices, [*CUBE_FACES, (1, 7, 9)])  # (0,0,0), (1,1,1), (2,2,2) are collinear
    )
    assert details["checks"]["no_degenerate_faces"] is False
    stl = ("solid t\nfacet normal 0 0 1\nouter loop\nvertex 0 0 0\nvertex 1 0 0\nvertex 0 1 0\n"
           "endloop\nendfacet\nendsolid t")  # fmt: skip
    value, details = scorer("mesh", {"checks": ["face_count"]})(stl)
    assert value == 1.0 and details["faces"] == 1


def test_garbage_and_oversized_meshes_score_zero(scorer):
    assert scorer("mesh")("this is not a mesh")[0] == 0.0
    value, details = scorer("mesh", {"max_bytes": 10})(obj(CUBE_VERTICES, CUBE_FACES))
    assert value == 0.0 and "larger than" in details["error"]


# --- terminal tasks: check scripts in the episode's sandbox ---------------------------------


def test_a_check_script_runs_in_the_live_episode_sandbox_and_in_a_snapshot(scorer):
    from sandboxes import Sandbox, SandboxSpec

    check = scorer("check_script", {"script": 'test "$(cat out/result.txt)" = 42'})
    graded = scorer("check_script", {
        "interpreter": ["python3", "-I", "-c"],
        "script": "import os\nprint('score: %.2f' % (len(os.listdir('out')) / 4))",
        "score_from": "stdout",
    })  # fmt: skip
    with Sandbox(SandboxSpec(memory_mb=128, timeout_s=5)) as episode:
        episode.run(["sh", "-c", "mkdir -p out && echo 41 > out/result.txt"])
        assert check("done", metadata={"sandbox": episode})[0] == 0.0
        episode.run(["sh", "-c", "echo 42 > out/result.txt && touch out/b"])
        assert check("done", metadata={"sandbox": episode})[0] == 1.0
        assert graded("done", metadata={"sandbox": episode})[0] == 0.5
        snapshot = episode.snapshot()
    assert check("done", metadata={"sandbox_snapshot": snapshot})[0] == 1.0


def test_a_check_script_without_an_episode_sandbox_scores_zero(scorer):
    value, details = scorer("check_script", {"script": "true"})("done")
    assert value == 0.0 and "no episode sandbox" in details["error"]


SERVICE_CHECK = """
import subprocess, sys, time, urllib.request
server = subprocess.Popen([sys.executable, "server.py"])
try:
    for _ in range(50):
        try:
            body = urllib.request.urlopen("http://127.0.0.1:8080/health", timeout=1).read()
            break
        except OSError:
            time.sleep(0.1)
    else:
        sys.exit("the service never answered")
    sys.exit(0 if body == b"ok" else "wrong answer: %r" % body)
finally:
    server.kill()
"""


def test_a_check_script_can_start_the_agents_service_and_query_it(scorer):
    from sandboxes import Sandbox, SandboxSpec

    server = (
        "from http.server import BaseHTTPRequestHandler, HTTPServer\n"
        "class Handler(BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers(); self.wfile.write(b'{body}')\n"
        "HTTPServer(('127.0.0.1', 8080), Handler).serve_forever()\n"
    )
    check = scorer(
        "check_script", {"interpreter": ["python3", "-I", "-c"], "script": SERVICE_CHECK}
    )
    with Sandbox(SandboxSpec(memory_mb=128, timeout_s=10, network="loopback")) as episode:
        episode.write_files({"server.py": server.format(body="ok")})
        assert check("done", metadata={"sandbox": episode})[0] == 1.0
        episode.write_files({"server.py": server.format(body="broken")})
        value, details = check("done", metadata={"sandbox": episode})
    assert value == 0.0 and "wrong answer" in details["stderr"]


@pytest.mark.slow
def test_a_local_causal_lm_serves_as_a_judge_engine(tmp_path):
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    from rewards.criteria.models import GenerationEngine, TransformersEngine

    raw = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]", "[EOS]"])
    raw.train_from_iterator(["FINAL SCORE : 1 2 3 4 5 6 7 8 9 grade the response"] * 3, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", eos_token="[EOS]")
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=16, n_layer=1, n_head=2, n_positions=2048)
    GPT2LMHeadModel(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)

    engine = TransformersEngine(str(tmp_path), device="cpu")
    assert isinstance(engine, GenerationEngine)
    outputs = engine.generate(["grade the response", "FINAL"], max_tokens=5, temperature=0)
    assert len(outputs) == 2 and all(len(o.split()) == 5 for o in outputs)
    spec = one_criterion("llm_judge", {"engine": "local", "rubric": "grade", "max_tokens": 4})
    result = Rubric.from_spec(spec, resources={"local": engine}).score(sample("x"))
    assert "error" not in result.details["c"]  # judged (a random model gives no score: 0)


def test_score_batch_calls_a_trl_function_once_for_the_whole_batch():
    reward_functions.CALLS.clear()
    spec = one_criterion("python_function", {"function": f"{FUNCTIONS}:counting_reward"})
    samples = [sample("ok"), sample("no", metadata={"extra": 1}), sample("ok!")]
    results = Rubric.from_spec(spec).score_batch(samples)
    assert [r.total for r in results] == [1.0, 0.0, 1.0]
    assert reward_functions.CALLS == [3]
    assert results[0].details["c"]["batched"] is True


def test_a_batch_call_that_fails_falls_back_to_one_sample_at_a_time():
    spec = one_criterion("python_function", {"function": f"{FUNCTIONS}:fails_in_batch"})
    results = Rubric.from_spec(spec).score_batch([sample("fine"), sample("bad"), sample("x")])
    assert [r.total for r in results] == [0.5, 0.0, 0.5]
    assert "bad sample" in results[1].details["c"]["error"]


@pytest.mark.slow
def test_the_reward_model_scores_a_batch_as_it_scores_each_sample(tiny_reward_model):
    directory, _, _ = tiny_reward_model
    spec = one_criterion("reward_model", {"path": str(directory), "device": "cpu", "batch_size": 2})
    rubric = Rubric.from_spec(spec)
    samples = [sample("good answer"), sample("bad answer poorly done"), sample("the task")]
    one_by_one = [rubric.score(s).total for s in samples]
    batched = rubric.score_batch(samples)
    assert [r.total for r in batched] == pytest.approx(one_by_one, abs=1e-5)
    assert all(r.details["c"]["batched"] for r in batched)
