"""What a researcher submits to launch a run, and how it becomes a pinned training spec.

The launch document is a run spec (``training.spec``) whose registry references are names:

    {
      "name": "parity-grpo",
      "base_model": "demo",                       # a registered model's slug ("slug@3": version 3)
      "domains": [{"domain": "parity", "weight": 1.0}],  # registry domains (weight: the
                                                  # domain's default mix weight when left out)
      "algorithm": {"algorithm": "grpo"}, "batch": {...}, "sampling": {...}, ...
    }

Every other section is the run spec's own (`run_spec_sections`). What only the console decides
is refused in the document: where outputs and checkpoints go, what to resume from, and each
domain's rubric, tasks and sandbox image, which are pinned from the registry at launch (the
domain's newest *published* rubric version, newest published sandbox image version, current
task-set version). A domain whose rubric has no published version cannot be launched.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from training.presets import learning_settings

# Sections of the launch document the console fills in itself.
CONSOLE_OWNED = {"output_dir": "set by the console (the run's own directory)"}
CONSOLE_OWNED_CHECKPOINT = {
    "dir": "set by the console (the run's checkpoint directory)",
    "resume": "set by the console (each attempt resumes from the run's last checkpoint)",
    "prune": "set by the console (it keeps keep_last of the checkpoints it recorded)",
}
DOMAIN_KEYS = {"domain", "weight", "pass_threshold", "max_new_tokens"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class LaunchError(Exception):
    """Every problem of a launch document, by path (``domains[1].weight``)."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        self.errors = errors
        first = next(iter(errors.items()))
        super().__init__(f"{first[0]}: {first[1][0]}" if first[0] else first[1][0])


def default_document(*, model: str, domains: list[tuple[str, float]]) -> dict[str, Any]:
    """The launch document the new-run form starts from: the settings measured to learn on the
    demo domains (`training.presets.learning_settings`)."""
    settings = learning_settings()
    settings["checkpoint"] = {"every_steps": 8, "keep_last": 2, "save_final": True}
    return {
        "name": "",
        "base_model": model,
        "domains": [{"domain": slug, "weight": weight} for slug, weight in domains],
        **settings,
    }


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` over ``base``, objects merged key by key (lists and values replaced)."""
    result = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merge(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def split_model_reference(reference: str) -> tuple[str, int | None]:
    """``"demo"`` -> ("demo", None: the newest version); ``"demo@3"`` -> ("demo", 3)."""
    slug, _, number = reference.partition("@")
    if number:
        if not number.isdigit() or int(number) < 1 or len(number) > 9:
            raise ValueError("a version after '@' is a number from 1")
        return slug, int(number)
    return slug, None


def check_document_shape(document: Any) -> dict[str, list[str]]:
    """The problems that need no database: the console-owned keys and the domain entries'
    shape. Everything else is checked by `training.spec` once references are resolved."""
    errors: dict[str, list[str]] = {}

    def add(path: str, message: str) -> None:
        errors.setdefault(path, []).append(message)

    if not isinstance(document, dict):
        add("", "the run spec must be an object")
        return errors
    name = document.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        add(
            "name",
            "required: 1-100 letters, digits, '.', '_' or '-', starting with one of the first two",
        )
    if not isinstance(document.get("base_model"), str) or not document.get("base_model"):
        add("base_model", "required: a registered model's slug (or 'slug@version')")
    for key, message in CONSOLE_OWNED.items():
        if key in document:
            add(key, message)
    checkpoint = document.get("checkpoint")
    if isinstance(checkpoint, dict):
        for key, message in CONSOLE_OWNED_CHECKPOINT.items():
            if key in checkpoint:
                add(f"checkpoint.{key}", message)
    domains = document.get("domains")
    if not isinstance(domains, list) or not domains:
        add("domains", "required: a non-empty list of {'domain': slug, 'weight': number}")
        return errors
    seen: set[str] = set()
    for i, entry in enumerate(domains):
        path = f"domains[{i}]"
        if not isinstance(entry, dict):
            add(path, "must be an object like {'domain': 'parity', 'weight': 1.0}")
            continue
        for key in sorted(set(entry) - DOMAIN_KEYS):
            why = (
                "pinned from the registry at launch"
                if key
                in {
                    "rubric_spec",
                    "tasks",
                    "task_source",
                    "eval_tasks",
                    "eval_source",
                    "sandbox_image",
                    "rubric_version",
                    "name",
                }
                else "unknown key"
            )
            add(f"{path}.{key}", why)
        slug = entry.get("domain")
        if not isinstance(slug, str) or not slug:
            add(f"{path}.domain", "required: the slug of one of your team's domains")
        elif slug in seen:
            add(f"{path}.domain", f"domain {slug!r} is listed twice")
        else:
            seen.add(slug)
    return errors


def launch_document_json_schema() -> dict[str, Any]:
    """The launch document's JSON Schema (published in the API's OpenAPI document): the run
    spec's own (`training.spec.run_spec_json_schema`), with registry references for the model
    and the domains, without what the console sets itself, and with every reference inlined
    (the OpenAPI document has no room for the spec's own ``$defs``)."""
    from training.spec import run_spec_json_schema

    schema = run_spec_json_schema()
    definitions = schema.pop("$defs", {})
    schema["title"] = "Launch document"
    properties = schema["properties"]
    for key in CONSOLE_OWNED:
        properties.pop(key, None)
    properties["base_model"] = {
        "type": "string",
        "minLength": 1,
        "description": "a registered model's slug, or 'slug@N' for its version N",
    }
    properties["domains"] = {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "additionalProperties": False,
            "required": ["domain"],
            "properties": {
                "domain": {"type": "string", "description": "one of your team's domains"},
                "weight": {"type": "number", "minimum": 0},
                "pass_threshold": {"type": "number"},
                "max_new_tokens": {"type": "integer", "minimum": 1},
            },
        },
    }
    checkpoint = definitions.get("CheckpointSpec", {}).get("properties", {})
    for key in CONSOLE_OWNED_CHECKPOINT:
        checkpoint.pop(key, None)

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(copy.deepcopy(definitions[ref.removeprefix("#/$defs/")]))
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(value) for value in node]
        return node

    return dict(inline(schema))
