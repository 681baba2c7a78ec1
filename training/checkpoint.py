"""Checkpoints that resume exactly: model, optimiser, sampler and RNG state, and the step.

Layout under the run's checkpoint directory (one sub-directory per checkpoint)::

    ckpt/
      step_00000004/
        <DeepSpeed's files: model and optimiser state, per rank, any ZeRO stage>
        run_state.json        the loop's state: step, sampler, live overrides, policy version
        rng_rank0.pt ...      torch / numpy / python RNG state of each rank
        hf/                   the policy as a Hugging Face directory (ZeRO 0-2), for serving
        COMPLETE              written last, by rank 0, after every rank finished
      step_00000006.partial/  a checkpoint being written (renamed into place when complete)
      latest                  DeepSpeed's pointer (informative; `find_latest` reads COMPLETE)

A checkpoint without ``COMPLETE`` (the job died while writing) is never resumed from, so a
crash during a save falls back to the previous checkpoint instead of loading half a state.
``run_state.json`` records the world size; resuming with another one is refused by name on
every rank (DeepSpeed itself only notices at ZeRO 1-3, and then on some ranks).
Across several hosts the checkpoint directory must be on a filesystem every rank sees (rank 0
writes ``run_state.json``; each rank its own RNG file and DeepSpeed shards), as DeepSpeed's own
checkpoints assume.

A directory has one writer: a save replaces a checkpoint of its own step and (when it prunes)
removes the ones newer than itself, which is right for one run resuming its own timeline and
wrong for two jobs sharing a directory. The console, where an old attempt's job can still be
running when the next attempt has taken over, gives each attempt a directory of its own and
resumes from the checkpoint its database accepted, not from a listing (`console.runs.sink`).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "COMPLETE_MARKER",
    "capture_rng_state",
    "find_latest",
    "list_checkpoints",
    "load_checkpoint",
    "restore_rng_state",
    "save_checkpoint",
]

COMPLETE_MARKER = "COMPLETE"
_PREFIX = "step_"
_HF_COPY = "hf"


def hf_copy(checkpoint: str | Path) -> Path:
    """The checkpoint's Hugging Face copy of the weights (``config.json``, safetensors,
    tokenizer): what a later run, vLLM or a promotion to a model version starts from. The
    checkpoint's own top level holds DeepSpeed's shards and the run state, which only a resume
    reads."""
    return Path(checkpoint) / _HF_COPY


def _tag(step: int) -> str:
    return f"{_PREFIX}{step:08d}"


def capture_rng_state() -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [
        path
        for path in root.iterdir()
        if path.is_dir()
        and path.name.startswith(_PREFIX)
        and path.name[len(_PREFIX) :].isdigit()  # not a staging (.partial) directory
        and (path / COMPLETE_MARKER).is_file()
    ]
    return sorted(found, key=lambda p: p.name)


def find_latest(root: str | Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def save_checkpoint(
    trainer: Any, root: str | Path, step: int, run_state: dict[str, Any], keep_last: int | None
) -> Path:
    """Saves (a collective call: every rank) and prunes to the ``keep_last`` newest (None:
    prunes nothing; the caller decides what goes).

    The checkpoint is written under a staging name and renamed into place once complete, so a
    re-save of the same step (a preemption right after resuming) never leaves a moment without
    a complete checkpoint. Checkpoints *newer* than ``step`` belong to a timeline this run
    abandoned (it resumed from an older one) and are removed, so ``resume: latest`` continues
    this one; the checkpoint just written is never pruned."""
    import torch.distributed as dist

    root = Path(root)
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    tag = _tag(step)
    path = root / tag
    staging = root / f"{tag}.partial"
    if rank == 0 and staging.exists():  # left by a save that died
        shutil.rmtree(staging)
    _barrier()
    trainer.engine.save_checkpoint(str(root), tag=staging.name, client_state={"step": step})
    torch.save(capture_rng_state(), staging / f"rng_rank{rank}.pt")
    if rank == 0:
        state = {**run_state, "world_size": world}
        (staging / "run_state.json").write_text(json.dumps(state, indent=1, sort_keys=True))
    # The Hugging Face copy is what a later run (or vLLM) starts from; under ZeRO-3 writing it
    # gathers the partitions, so every rank takes part.
    trainer.save_pretrained(hf_copy(staging), writer=rank == 0)
    _barrier()
    if rank == 0:
        (staging / COMPLETE_MARKER).write_text(json.dumps({"step": step}) + "\n")
        if path.exists():
            replaced = root / f"{tag}.replaced"
            shutil.rmtree(replaced, ignore_errors=True)
            path.rename(replaced)
            staging.rename(path)
            shutil.rmtree(replaced, ignore_errors=True)
        else:
            staging.rename(path)
        (root / "latest").write_text(tag)  # DeepSpeed's pointer named the staging directory
    if rank == 0 and keep_last is not None:
        found = list_checkpoints(root)
        abandoned = [p for p in found if _step_of(p) > step]
        older = [p for p in found if _step_of(p) <= step and p != path]
        for old in abandoned + older[: max(0, len(older) - (keep_last - 1))]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return path


def _step_of(path: Path) -> int:
    return int(path.name[len(_PREFIX) :])


def load_checkpoint(trainer: Any, path: str | Path) -> dict[str, Any]:
    """Loads model, optimiser and this rank's RNG state; returns the loop's run state."""
    import torch.distributed as dist

    path = Path(path)
    if not (path / COMPLETE_MARKER).is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {COMPLETE_MARKER})")
    run_state = dict(json.loads((path / "run_state.json").read_text()))
    world = dist.get_world_size() if dist.is_initialized() else 1
    written_by = int(run_state.get("world_size", world))
    if written_by != world:  # every rank raises, before DeepSpeed loads anything
        raise ValueError(
            f"{path} was written by {written_by} rank(s) and this run has {world}: resume with "
            f"{written_by}, or start a new run from its hf/ copy as the base model"
        )
    loaded, _ = trainer.engine.load_checkpoint(
        str(path.parent),
        tag=path.name,
        load_optimizer_states=True,
        load_lr_scheduler_states=True,
    )
    if loaded is None:
        raise RuntimeError(f"DeepSpeed could not load the checkpoint in {path}")
    rank = dist.get_rank() if dist.is_initialized() else 0
    rng_file = path / f"rng_rank{rank}.pt"
    if not rng_file.is_file():
        raise FileNotFoundError(
            f"{rng_file} is missing: was this checkpoint written with a different world size?"
        )
    restore_rng_state(torch.load(rng_file, weights_only=False))
    return run_state
