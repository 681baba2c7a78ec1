"""``python -m rewards``: score samples with a rubric from the command line.

    python -m rewards score --rubric rubric.json --samples samples.jsonl [--workers 4] [--json]
    python -m rewards validate --rubric rubric.yaml
    python -m rewards kinds

The console's "try this rubric on a sample" calls `try_rubric` and `result_rows`, the same
code the command uses.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rewards.registry import criterion_kinds
from rewards.rubric import Rubric
from rewards.spec import RubricSpecError, validate_spec
from rewards.types import RewardResult, Sample


class InputError(ValueError):
    """A rubric or samples file that cannot be read; the message names the file and line."""


def load_rubric_spec(path: str | Path) -> dict[str, Any]:
    """A rubric spec from a JSON or YAML file (by extension; JSON otherwise)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except (ValueError, ImportError) as exc:
        raise InputError(f"{path}: not valid {path.suffix.lstrip('.') or 'JSON'}: {exc}") from exc
    if not isinstance(data, dict):
        raise InputError(f"{path}: a rubric must be an object")
    return data


def read_samples(path: str | Path) -> list[Sample]:
    """Samples from a JSONL file, one object a line; errors name the line."""
    path = Path(path)
    samples = []
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from exc
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                samples.append(Sample.from_dict(json.loads(line)))
            except ValueError as exc:
                raise InputError(f"{path}:{number}: {exc}") from exc
    return samples


def try_rubric(
    spec: dict[str, Any],
    samples: Iterable[Sample | dict[str, Any]],
    *,
    max_workers: int | None = None,
    resources: dict[str, Any] | None = None,
) -> list[RewardResult]:
    """Builds the rubric (raising `RubricSpecError`), scores the samples, closes it."""
    with Rubric.from_spec(spec, resources=resources) as rubric:
        return rubric.score_batch(samples, max_workers=max_workers)


def result_rows(names: Sequence[str], results: Sequence[RewardResult]) -> list[dict[str, Any]]:
    """One plain row per result: total, each criterion's score, and any criterion errors."""
    rows = []
    for index, result in enumerate(results):
        errors = {
            name: str(result.details.get(name, {}).get("error"))
            for name in names
            if isinstance(result.details.get(name), dict) and result.details[name].get("error")
        }
        rows.append(
            {
                "index": index,
                "total": result.total,
                "scores": {name: result.breakdown.get(name, 0.0) for name in names},
                "errors": errors,
            }
        )
    return rows


def format_table(names: Sequence[str], results: Sequence[RewardResult]) -> str:
    """A fixed-width table: one line per sample, a mean line, then criterion errors."""
    headers = ["#", "total", *names]
    body = []
    for row in result_rows(names, results):
        cells = [str(row["index"]), f"{row['total']:.4f}"]
        for name in names:
            mark = "!" if name in row["errors"] else ""
            cells.append(f"{row['scores'][name]:.4f}{mark}")
        body.append(cells)
    if results:
        means = [sum(r.breakdown.get(n, 0.0) for r in results) / len(results) for n in names]
        total = sum(r.total for r in results) / len(results)
        body.append(["mean", f"{total:.4f}", *[f"{m:.4f}" for m in means]])
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in body)
    notes = [
        f"  sample {row['index']}, {name}: {message}"
        for row in result_rows(names, results)
        for name, message in row["errors"].items()
    ]
    if notes:
        lines += ["", "! criterion errors (scored 0):", *notes]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rewards", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    score = commands.add_parser("score", help="score samples and print a table")
    score.add_argument("--rubric", required=True, help="rubric spec (.json, .yaml)")
    score.add_argument("--samples", required=True, help="samples, one JSON object a line")
    score.add_argument("--workers", type=int, default=None, help="samples scored at once")
    score.add_argument("--json", action="store_true", help="print JSON lines, not a table")
    validate = commands.add_parser("validate", help="list every problem in a rubric spec")
    validate.add_argument("--rubric", required=True)
    commands.add_parser("kinds", help="list the criterion kinds")
    args = parser.parse_args(argv)

    try:
        if args.command == "kinds":
            for name, info in criterion_kinds().items():
                sandbox = " [sandbox]" if info.uses_sandbox else ""
                print(f"{name:20} {info.summary}{sandbox}")
            return 0
        spec = load_rubric_spec(args.rubric)
        if args.command == "validate":
            issues = validate_spec(spec)
            for issue in issues:
                print(f"{args.rubric}: {issue}")
            if not issues:
                print(f"{args.rubric}: valid")
            return 1 if issues else 0
        samples = read_samples(args.samples)
        if args.workers is not None and args.workers < 1:
            raise InputError("--workers must be at least 1")
        results = try_rubric(spec, samples, max_workers=args.workers)
    except RubricSpecError as exc:
        for issue in exc.issues:
            print(f"{args.rubric}: {issue}", file=sys.stderr)
        return 2
    except InputError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    names = [c["name"] for c in spec["criteria"]]
    if args.json:
        for result in results:
            print(json.dumps(result.to_dict(), default=str))
    else:
        print(format_table(names, results))
    return 0
