"""Models without a hub: the demo model, built reproducibly from a seed.

``python -m training.models make-demo [--size test|bench] [--out DIR] [--force]`` builds a
small Llama-shaped model (head_dim 64, which vLLM's CPU attention needs) and a byte-level BPE
tokenizer trained in-process on the demo domains' text (``training.demo``), then gives it a
short supervised warm-up on the train split so that it already solves some held-out tasks — a
base for RL to improve. The result is a plain Hugging Face directory (``config.json``,
``model.safetensors``, ``tokenizer.json`` with the demo chat template) that loads in
``transformers`` and vLLM alike, cached under ``var/models/`` (``$CONSOLE_VAR_DIR/models``).

Sizes: ``test`` (about 1.5M parameters; builds in well under a minute on 2 cores) is what the
tests and the console demo use; ``bench`` (about 25M parameters) is what the benchmarks use,
because engine comparisons on a tiny model only measure start-up.

``ensure_demo_model(path=None, size="test")`` returns the cached directory, building it when it
is missing or was built with different settings (``demo_build.json`` records them). Builds take
a file lock and write to a temporary directory renamed into place, so concurrent test processes
never see half a model.
"""

from __future__ import annotations

import argparse
import collections
import fcntl
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from training.demo import CHAT_TEMPLATE, END, SPECIAL_TOKENS, demo_domains, user_prompt
from training.demo.chat import PAD
from training.threads import cpu_threads

# Bump when the recipe changes so cached models built by an older recipe are rebuilt.
# 6: json_format's demonstrations use a field naming drawn at random, not the one asked for
# (training.demo.domains), so the base writes either and RL has a skill to teach there.
# 7: json_format asks for the two counts only (no total), and the build runs with portable
# numerics (PORTABLE_NUMERICS_ENV): the same bits on every x86-64 machine with AVX2.
# 8: code asks for one operator (``x times 7``, constants 1-99) and its demonstrations use an
# operator drawn at random, not the one asked for, so the base writes any of the three and RL has
# reading the word to teach there.
RECIPE_VERSION = 8
BUILD_RECORD = "demo_build.json"
REPO_ROOT = Path(__file__).resolve().parents[1]


def var_dir() -> Path:
    return Path(os.environ.get("CONSOLE_VAR_DIR", str(REPO_ROOT / "var")))


@dataclass(frozen=True)
class DemoModelSize:
    hidden_size: int
    num_layers: int
    intermediate_size: int
    vocab_size: int
    warmup_steps: int
    batch_size: int
    learning_rate: float

    @property
    def num_heads(self) -> int:
        # head_dim is fixed at 64: vLLM's CPU attention rejects smaller heads.
        return self.hidden_size // 64


SIZES: dict[str, DemoModelSize] = {
    "test": DemoModelSize(
        hidden_size=192,
        num_layers=3,
        intermediate_size=512,
        vocab_size=512,
        # lr 5e-3 (recipe 4) sat at the edge: whether the model learned to copy digits from
        # the prompt within the warm-up depended on the machine's rounding (it did on one
        # machine; on an AVX-512 Xeon it never did, and no RL setting could then teach parity).
        # At 2e-3 reading the last digit is learned by step 300-400 on every seed tried
        # (0, 1, 2), copying follows. Measured levels: bench/README.md, "Demo model".
        warmup_steps=800,
        batch_size=32,
        learning_rate=2e-3,
    ),
    "bench": DemoModelSize(
        hidden_size=512,
        num_layers=8,
        intermediate_size=1408,
        vocab_size=2048,
        # Benchmarks need realistic shapes and lengths, not skill: a few steps teach the format.
        warmup_steps=40,
        batch_size=32,
        learning_rate=1e-3,
    ),
}
MAX_POSITIONS = 512
# Share of the warm-up examples a domain of warmup_weight 1 gets; copy drills fill what is left.
FULL_DOMAIN_SHARE = 0.2
# Share of the warm-up examples that drill reading a number's last digit (see
# `_last_digit_drills`).
LAST_DIGIT_SHARE = 0.05
# Held-out tasks per domain in the build record's quick check (not part of the recipe).
EVAL_PER_DOMAIN = 16


def default_demo_dir(size: str = "test") -> Path:
    return var_dir() / "models" / ("demo" if size == "test" else f"demo-{size}")


def _build_settings(size: str, seed: int) -> dict[str, Any]:
    if size not in SIZES:
        raise ValueError(f"unknown demo model size {size!r}; expected one of {sorted(SIZES)}")
    return {"recipe": RECIPE_VERSION, "size": size, "seed": seed, **asdict(SIZES[size])}


def ensure_demo_model(
    path: str | Path | None = None,
    size: str = "test",
    seed: int = 0,
    force: bool = False,
    log: Any = None,
) -> Path:
    """The demo model's directory, built (deterministically from ``seed``) if missing."""
    target = Path(path) if path is not None else default_demo_dir(size)
    settings = _build_settings(size, seed)
    if not force and _is_built(target, settings):
        _refresh_chat_template(target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # Someone else may have built it while we waited.
        if force or not _is_built(target, settings):
            build_demo_model(target, size=size, seed=seed, log=log)
    return target


def _refresh_chat_template(target: Path) -> None:
    """Keep the cached model's chat template in step with ``CHAT_TEMPLATE``.

    The template is not learned, so a change to it should not cost a rebuild.
    """
    template = target / "chat_template.jinja"
    if template.is_file() and template.read_text() != CHAT_TEMPLATE:
        staging = template.with_name(f".{template.name}.new")
        staging.write_text(CHAT_TEMPLATE)
        staging.replace(template)


def _is_built(target: Path, settings: dict[str, Any]) -> bool:
    record = target / BUILD_RECORD
    if not record.is_file():
        return False
    try:
        built = json.loads(record.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return built.get("settings") == settings


# The build runs in a child process whose numeric libraries take the same code paths on every
# x86-64 CPU with AVX2 (every server CPU of the last ten years), so every machine starts RL from
# the same base: MKL's conditional numerical reproducibility at AVX2 (its matrix products
# otherwise pick AVX2 or AVX-512 kernels, which round differently) and ATen's AVX2 kernels (its
# vectorised softmax, norms, exponentials and random draws differ between AVX2 and AVX-512).
# Both are read when the libraries load, so a process that has imported torch cannot switch
# them for itself. The portable "COMPATIBLE" mode and ATen's scalar kernels would cover older
# CPUs too, but made the warm-up 2.3x slower; the AVX2 paths cost 1.17x.
PORTABLE_NUMERICS_ENV = {
    "MKL_CBWR": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
# ATen takes ATEN_CPU_CAPABILITY=avx2 on trust: on a CPU without AVX2 and FMA (an emulated
# "qemu64" CI runner, say) its kernels would die of SIGILL. Such a CPU gets only the thread
# pins (the libraries choose their own paths there, so its bits are its own).
_AVX2_PINS = ("MKL_CBWR", "ATEN_CPU_CAPABILITY")


def _cpu_flags() -> set[str]:
    """The CPU's feature flags as /proc/cpuinfo names them (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def portable_numerics_env() -> dict[str, str]:
    """``PORTABLE_NUMERICS_ENV``, less the AVX2 pins where this CPU cannot run AVX2 code."""
    if {"avx2", "fma"} <= _cpu_flags():
        return dict(PORTABLE_NUMERICS_ENV)
    return {k: v for k, v in PORTABLE_NUMERICS_ENV.items() if k not in _AVX2_PINS}


# Lines of the build's output kept for the error when it fails.
_FAILURE_TAIL_LINES = 30


def build_demo_model(
    target: str | Path, size: str = "test", seed: int = 0, log: Any = None
) -> dict[str, Any]:
    """Build the demo model into ``target`` (replacing it) and return its build record.

    The same ``size`` and ``seed`` give the same bits on any x86-64 machine with AVX2
    (``PORTABLE_NUMERICS_ENV``); the caller's process and random stream are left alone.
    """
    settings = _build_settings(size, seed)
    # Absolute: the child runs in the repository root, not the caller's directory.
    target = Path(target).absolute()
    say = log or (lambda message: None)
    job = {"settings": settings, "eval_per_domain": EVAL_PER_DOMAIN}
    command = [
        sys.executable,
        "-m",
        "training.models",
        "build-worker",
        json.dumps(job),
        str(target),
    ]
    child = subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env={**os.environ, **portable_numerics_env()},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert child.stdout is not None
    tail: collections.deque[str] = collections.deque(maxlen=_FAILURE_TAIL_LINES)
    for line in child.stdout:
        say(line.rstrip("\n"))
        tail.append(line.rstrip("\n"))
    if child.wait() != 0:
        output = "\n".join(tail)
        raise RuntimeError(f"building the demo model failed (exit {child.returncode}):\n{output}")
    record: dict[str, Any] = json.loads((target / BUILD_RECORD).read_text())
    return record


def _build_here(job: dict[str, Any], target: Path) -> None:
    """The build itself, in the child process ``build_demo_model`` starts."""
    settings = job["settings"]
    shape = DemoModelSize(**{name: settings[name] for name in DemoModelSize.__dataclass_fields__})
    say = lambda message: print(message, flush=True)  # noqa: E731
    # One thread: reductions split across threads round differently.
    with cpu_threads(1):
        _build(target, shape, settings, job["eval_per_domain"], time.monotonic(), say)


def _build(
    target: Path,
    shape: DemoModelSize,
    settings: dict[str, Any],
    eval_per_domain: int,
    started: float,
    say: Any,
) -> None:
    seed = settings["seed"]
    torch.manual_seed(seed)
    sft = _sft_corpus(shape.warmup_steps * shape.batch_size, seed)
    tokenizer = train_tokenizer([prompt + completion for prompt, completion in sft], shape)
    model = _fresh_model(tokenizer, shape, seed)
    say(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")
    losses = _warm_up(model, tokenizer, sft, shape, seed, say)
    model.eval()
    held_out = evaluate_exact(model, tokenizer, n_per_domain=eval_per_domain, seed=seed)
    record = {
        "settings": settings,
        "parameters": sum(p.numel() for p in model.parameters()),
        "warmup_final_loss": losses[-1] if losses else None,
        "held_out_exact_match": held_out,
        "build_seconds": round(time.monotonic() - started, 1),
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        (staging / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    say(f"built {target} in {record['build_seconds']} s; held-out exact match {held_out}")


def _sft_corpus(n_examples: int, seed: int) -> list[tuple[str, str]]:
    """Demonstrations of every demo domain, plus copy drills filling the rest of the mix.

    A full domain (``warmup_weight`` 1) takes a fifth of the examples; ``parity`` a quarter of
    that (its labels are guesses: it is there to learn the answer format, not the skill).

    Every domain needs the model to copy numbers from the prompt; a small model learns that
    (an induction head) abruptly and late, and whether it had by the end of a short warm-up
    varied from seed to seed. Drills that are nothing but copying bring it forward reliably.
    """
    examples = [
        example
        for domain in demo_domains(include_tool_use=True)
        for example in domain.sft_examples(
            math.ceil(n_examples * FULL_DOMAIN_SHARE * domain.warmup_weight), seed
        )
    ]
    examples += _last_digit_drills(math.ceil(n_examples * LAST_DIGIT_SHARE), seed)
    examples += _copy_drills(n_examples - len(examples), seed)
    random.Random(seed).shuffle(examples)
    return examples


def _last_digit_drills(n: int, seed: int) -> list[tuple[str, str]]:
    """ "What is the last digit of 4821?" -> \\boxed{1}: a feature that parity needs, not parity.

    With parity's coin-flip labels alone, the model learns to ignore the number when it
    answers, and whether RL could then find the last digit at all depended on the warm-up's
    rounding (it did on one machine and never on another). Drills that read the last digit
    into a boxed answer leave that feature at the answer position on every build; which digit
    means "even" is still for the reward to teach.
    """
    rng = random.Random(f"last-digit:{seed}")
    drills = []
    for _ in range(max(0, n)):
        number = rng.randint(0, 9999)
        question = f"What is the last digit of {number}?"
        drills.append((user_prompt(question), f"\\boxed{{{number % 10}}}" + END))
    return drills


def _copy_drills(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(f"copy:{seed}")
    words = ("figs", "x", "print", "total", "apples", "f", "return", "plus", "times", "minus")
    drills = []
    for _ in range(max(0, n)):
        parts = [
            str(rng.randint(0, 10 ** rng.randint(1, 4)))
            if rng.random() < 0.6
            else rng.choice(words)
            for _ in range(rng.randint(1, 4))
        ]
        text = " ".join(parts)
        drills.append((user_prompt(f"Repeat: {text}"), text + END))
    return drills


def train_tokenizer(texts: Sequence[str], shape: DemoModelSize) -> Any:
    """A byte-level BPE tokenizer (every string encodes) with single-digit number tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    # Digits one by one: numbers then share a small set of tokens, which arithmetic needs.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=END,
        pad_token=PAD,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (END, PAD)],
        padding_side="left",
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _fresh_model(tokenizer: Any, shape: DemoModelSize, seed: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_heads,
        head_dim=64,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        # The tokenizer adds no BOS; point it at END so nothing expects a token we lack.
        bos_token_id=tokenizer.eos_token_id,
        dtype="float32",
    )
    return LlamaForCausalLM(config)


def _warm_up(
    model: Any,
    tokenizer: Any,
    examples: list[tuple[str, str]],
    shape: DemoModelSize,
    seed: int,
    say: Any,
) -> list[float]:
    """Supervised warm-up: cross-entropy on the completion tokens only."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=shape.learning_rate, weight_decay=0.0)
    steps = shape.warmup_steps
    warmup = max(1, steps // 10)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: (
            min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps))
        ),
    )
    encoded = [
        (tokenizer(prompt)["input_ids"], tokenizer(completion)["input_ids"])
        for prompt, completion in examples
    ]
    model.train()
    losses: list[float] = []
    for step in range(steps):
        picks = torch.randint(len(encoded), (shape.batch_size,), generator=generator).tolist()
        input_ids, labels = _pad_batch([encoded[i] for i in picks], tokenizer.pad_token_id)
        # Right padding needs no attention mask: causal attention never looks ahead, and padded
        # positions carry no labels.
        loss = model(input_ids=input_ids, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(float(loss.detach()))
        if step % 50 == 0 or step == steps - 1:
            say(f"warm-up step {step}/{steps} loss {losses[-1]:.3f}")
    return losses


def _pad_batch(
    pairs: list[tuple[list[int], list[int]]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(len(p) + len(c) for p, c in pairs)
    input_ids = torch.full((len(pairs), length), pad_id, dtype=torch.long)
    labels = torch.full((len(pairs), length), -100, dtype=torch.long)
    for row, (prompt, completion) in enumerate(pairs):
        ids = prompt + completion
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, len(prompt) : len(ids)] = torch.tensor(completion)
    return input_ids, labels


@torch.no_grad()
def evaluate_exact(model: Any, tokenizer: Any, n_per_domain: int, seed: int) -> dict[str, float]:
    """Greedy exact match against the reference answer on held-out tasks, per domain.

    A quick, rubric-free check of the warm-up (the rewards library scores real runs). The
    tool-use domain is judged on its first turn, the tool call, since no tool runs here.
    """
    scores: dict[str, float] = {}
    for domain in demo_domains(include_tool_use=True):
        drafts = domain._drafts(n_per_domain, seed + 1, "held_out")
        prompts = [domain._task(d)["prompt"] for d in drafts]
        expected = [d.reference.split(END)[0] for d in drafts]
        completions = greedy_complete(model, tokenizer, prompts, domain.max_new_tokens)
        hits = sum(
            got.strip() == want.strip() for got, want in zip(completions, expected, strict=True)
        )
        scores[domain.name] = round(hits / len(drafts), 3)
    return scores


@torch.no_grad()
def greedy_complete(
    model: Any, tokenizer: Any, prompts: list[str], max_new_tokens: int
) -> list[str]:
    batch = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    out = model.generate(
        **batch,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    new_tokens = out[:, batch["input_ids"].shape[1] :]
    return tokenizer.batch_decode(new_tokens, skip_special_tokens=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.models")
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("make-demo", help="build the demo model (cached)")
    make.add_argument("--size", choices=sorted(SIZES), default="test")
    make.add_argument("--seed", type=int, default=0)
    make.add_argument("--out", type=Path, default=None, help="directory (default var/models/demo)")
    make.add_argument("--force", action="store_true", help="rebuild even if cached")
    worker = commands.add_parser("build-worker", help="(internal) the build's child process")
    worker.add_argument("job", type=json.loads)
    worker.add_argument("out", type=Path)
    args = parser.parse_args(argv)

    if args.command == "build-worker":
        _build_here(args.job, args.out)
        return 0

    target = args.out or default_demo_dir(args.size)
    if not args.force and _is_built(target, _build_settings(args.size, args.seed)):
        print(f"{target} is up to date ({BUILD_RECORD} matches); --force rebuilds it")
        return 0
    say = lambda message: print(message, flush=True)  # noqa: E731
    ensure_demo_model(target, size=args.size, seed=args.seed, force=args.force, log=say)
    print(json.loads((target / BUILD_RECORD).read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
