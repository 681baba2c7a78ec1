"""Demo domains: deterministic tasks, disjoint splits, rubric specs the rewards library accepts,
and reference completions that earn full reward under the real rubric."""

import json

import pytest

import rewards
from tests.training.rollout_fixtures import demo_model_dir  # noqa: F401
from training.demo import (
    demo_domains,
    format_observation,
    get_domain,
    parse_tool_calls,
    render_chat,
    user_prompt,
)

ALL_DOMAINS = demo_domains(include_tool_use=True)


def test_default_domains_are_single_turn_and_tool_use_is_opt_in():
    assert [d.name for d in demo_domains()] == ["arithmetic", "json_format", "code", "parity"]
    assert [d.name for d in ALL_DOMAINS][-1] == "tool_calc"
    assert get_domain("tool_calc").tools == ("python",)
    with pytest.raises(KeyError, match="no demo domain 'nope'"):
        get_domain("nope")


@pytest.mark.parametrize("domain", ALL_DOMAINS, ids=lambda d: d.name)
def test_tasks_are_deterministic_in_seed_and_differ_across_seeds(domain):
    first = domain.make_tasks(20, seed=3, split="train")
    assert first == domain.make_tasks(20, seed=3, split="train")
    assert first != domain.make_tasks(20, seed=4, split="train")
    task = first[0]
    assert set(task) == {"prompt", "ground_truth", "metadata"}
    assert task["prompt"] == user_prompt(task["metadata"]["question"])
    assert task["metadata"]["domain"] == domain.name


@pytest.mark.parametrize("domain", ALL_DOMAINS, ids=lambda d: d.name)
def test_held_out_tasks_never_appear_in_the_train_split(domain):
    train = {t["metadata"]["task_id"] for t in domain.make_tasks(400, seed=0, split="train")}
    test = {t["metadata"]["task_id"] for t in domain.make_tasks(100, seed=0, split="held_out")}
    assert train and test
    assert not train & test


def test_bad_split_and_count_are_refused():
    domain = get_domain("arithmetic")
    with pytest.raises(ValueError, match="split must be one of"):
        domain.make_tasks(1, split="validation")
    with pytest.raises(ValueError, match="n must be"):
        domain.make_tasks(-1)


@pytest.mark.parametrize("domain", ALL_DOMAINS, ids=lambda d: d.name)
def test_rubric_spec_is_valid_for_the_rewards_library(domain):
    assert rewards.validate_spec(domain.rubric_spec) == []


def _final_answer(completion: str) -> str:
    """The last assistant turn of a reference completion (tool_calc has several turns)."""
    return completion.split("<|assistant|>\n")[-1].replace("<|end|>", "")


@pytest.mark.parametrize("domain", ALL_DOMAINS, ids=lambda d: d.name)
def test_reference_completions_earn_full_reward_and_wrong_ones_do_not(domain, closing):
    rubric = rewards.Rubric.from_spec(domain.rubric_spec)
    # Code rubrics hold zygote sandboxes until closed.
    closing.append(rubric)
    tasks = domain.make_tasks(3, seed=1, split="held_out")
    references = [_final_answer(c) for _, c in domain.reference_completions(3, seed=1)]
    # References come from the train split; score them against their own tasks.
    train_tasks = domain.make_tasks(3, seed=1, split="train")
    for task, reference in zip(train_tasks, references, strict=True):
        sample = rewards.Sample(
            domain=domain.name,
            prompt=task["prompt"],
            completion=reference,
            ground_truth=task["ground_truth"],
            metadata=task["metadata"],
        )
        assert rubric.score(sample).total == pytest.approx(1.0), reference
    wrong = rewards.Sample(
        domain=domain.name,
        prompt=tasks[0]["prompt"],
        completion="I do not know.",
        ground_truth=tasks[0]["ground_truth"],
        metadata=tasks[0]["metadata"],
    )
    assert rubric.score(wrong).total == pytest.approx(0.0)


def test_warm_up_demonstrations_are_the_references_except_where_a_domain_guesses(closing):
    for domain in ALL_DOMAINS:
        if domain.name not in ("parity", "json_format", "code"):  # the other two: tests below
            assert domain.sft_examples(5, seed=2) == domain.reference_completions(5, seed=2)
    parity = get_domain("parity")
    rubric = rewards.Rubric.from_spec(parity.rubric_spec)
    # Code rubrics hold zygote sandboxes until closed.
    closing.append(rubric)
    tasks = parity.make_tasks(400, seed=0, split="train")
    demonstrations = parity.sft_examples(400, seed=0)
    assert [p for p, _ in demonstrations] == [t["prompt"] for t in tasks]
    scores = [
        rubric.score(
            rewards.Sample(
                domain="parity",
                prompt=task["prompt"],
                completion=_final_answer(completion),
                ground_truth=task["ground_truth"],
                metadata=task["metadata"],
            )
        ).total
        for task, (_, completion) in zip(tasks, demonstrations, strict=True)
    ]
    # Coin flips in the answer format: right about half the time (400 flips: 0.5 ± 0.1 is
    # four standard deviations), never unparseable.
    assert all(c.startswith("\\boxed{") for _, c in demonstrations)
    assert 0.4 < sum(scores) / len(scores) < 0.6


def test_json_answer_has_the_names_asked_for_and_the_counts_of_the_question():
    domain = get_domain("json_format")
    tasks = domain.make_tasks(40, seed=0, split="held_out")
    for task in tasks:
        first, second = task["ground_truth"]
        answer = task["ground_truth"]
        question = task["metadata"]["question"]
        assert question.startswith(f"A basket holds {answer[first]} ")
        assert f" and {answer[second]} " in question
        assert question.endswith(f"giving {first} and {second}.")
    assert {t["metadata"]["naming"] for t in tasks} == {"first", "left"}


def test_json_demonstrations_ignore_the_names_asked_for_and_the_rubric_pays_for_them():
    """The warm-up's annotator used a naming drawn at random: the base writes either, and only
    the rubric says which one the question asked for (its reference scores 1, the other
    naming 0.1: well-formed, no field asked for)."""
    domain = get_domain("json_format")
    rubric = rewards.Rubric.from_spec(domain.rubric_spec)
    tasks = domain.make_tasks(200, seed=0, split="train")
    demonstrations = domain.sft_examples(200, seed=0)
    followed = 0
    for task, (_, completion) in zip(tasks, demonstrations, strict=True):
        answer = json.loads(completion.removesuffix("<|end|>"))
        assert list(answer.values()) == list(task["ground_truth"].values())
        followed += list(answer) == list(task["ground_truth"])
        score = rubric.score(
            rewards.Sample(
                domain="json_format",
                prompt=task["prompt"],
                completion=json.dumps(answer),
                ground_truth=task["ground_truth"],
            )
        ).total
        assert score == pytest.approx(1.0 if list(answer) == list(task["ground_truth"]) else 0.1)
    # 200 coin flips: 0.5 ± 0.14 is four standard deviations.
    assert 0.36 < followed / len(tasks) < 0.64


def test_code_demonstrations_mix_up_the_operator_word_and_the_tests_pay_for_the_right_one(
    closing,
):
    """The warm-up's annotator kept the constant and drew the operator at random: the base
    writes any of the three, and only the unit tests say which one the words asked for (the
    reference passes all five; a mixed-up operator passes few)."""
    domain = get_domain("code")
    rubric = rewards.Rubric.from_spec(domain.rubric_spec)
    closing.append(rubric)
    tasks = domain.make_tasks(150, seed=0, split="train")
    demonstrations = domain.sft_examples(150, seed=0)
    symbols = {"plus": "+", "minus": "-", "times": "*"}
    followed = 0
    scores = {True: [], False: []}
    for task, (_, completion) in zip(tasks, demonstrations, strict=True):
        word, constant = task["metadata"]["question"].removesuffix(".").split()[-2:]
        body = completion.removesuffix("<|end|>")
        assert body.startswith("```python\ndef f(x):\n    return x ")
        assert body.endswith(f" {constant}\n```")
        right = f"x {symbols[word]} {constant}" in body
        followed += right
        scores[right].append(
            rubric.score(
                rewards.Sample(
                    domain="code",
                    prompt=task["prompt"],
                    completion=body,
                    ground_truth=task["ground_truth"],
                    metadata=task["metadata"],
                )
            ).total
        )
    assert set(scores[True]) == {1.0}
    assert max(scores[False]) <= 0.4  # at most two of five inputs agree by coincidence
    # 150 draws of one in three: 0.33 ± 0.15 is four standard deviations.
    assert 0.18 < followed / len(tasks) < 0.48
    assert {t["metadata"]["operator"] for t in tasks} == set(symbols)


def test_chat_rendering_matches_the_tokenizer_chat_template(demo_model_dir):  # noqa: F811
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir)
    messages = [
        {"role": "user", "content": "Use the python tool to compute 12 * 34."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_0_0",
                    "type": "function",
                    "function": {
                        "name": "python",
                        "arguments": {"code": "print(12 * 34)"},
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0_0", "content": "408"},
    ]
    ours = render_chat(messages)
    theirs = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours == theirs
    assert ours.endswith(
        "<tool>python\nprint(12 * 34)\n</tool><|end|>\n<|tool|>\n408<|end|>\n<|assistant|>\n"
    )
    # OpenAI's JSON-string arguments render the same through render_chat.
    call = messages[1]["tool_calls"][0]["function"]
    call["arguments"] = json.dumps(call["arguments"])
    assert render_chat(messages) == ours


def test_tool_calls_parse_in_order_and_prose_is_kept():
    text = "Let me check.<tool>python\nprint(1)\n</tool><tool>shell\necho hi\n</tool>"
    prose, calls = parse_tool_calls(text)
    assert prose == "Let me check."
    assert [(c.name, c.code) for c in calls] == [("python", "print(1)"), ("shell", "echo hi")]
    assert json.loads(calls[0].to_openai("c")["function"]["arguments"]) == {"code": "print(1)"}
    assert parse_tool_calls("\\boxed{3}") == ("\\boxed{3}", [])


def test_observation_shows_stderr_and_exit_status_only_when_they_matter():
    assert format_observation("408\n", "", 0) == "408"
    failed = format_observation("", "NameError: x\n", 1)
    assert failed == "[stderr]\nNameError: x\n[exit 1]"
    assert format_observation("", "", None, "timed out") == "[timed out]"
