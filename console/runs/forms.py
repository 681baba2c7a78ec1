"""Forms of the runs pages. They only parse input; `services.run_launch` checks the launch
document (every problem by path) and the views map its paths back onto these fields."""

from __future__ import annotations

import math
from typing import Any

import yaml
from django import forms
from django.core.exceptions import ValidationError

from console.registry.models import Domain
from console.runs.models import ModelVersion
from training.algorithm_config import ALGORITHM_PRESETS, KL_ESTIMATORS

MAX_ADVANCED_CHARS = 100_000

# Launch-document path -> the form field that shows its errors.
FIELD_FOR_PATH = {
    "name": "name",
    "base_model": "base_model",
    "max_steps": "max_steps",
    "lr": "lr",
    "algorithm": "algorithm",
    "batch.prompts_per_step": "prompts_per_step",
    "batch.group_size": "group_size",
    "kl.coef": "kl_coef",
    "kl.estimator": "kl_estimator",
    "sampling.temperature": "temperature",
    "sampling.max_new_tokens": "max_new_tokens",
    "tools.enabled": "tools",
    "eval.every_steps": "eval_every",
    "checkpoint.every_steps": "checkpoint_every",
    "ewc": "ewc_strength",
    "ewc.strength": "ewc_strength",
    "gpus": "gpus",
    "hosts": "hosts",
    "priority": "priority",
    "priority_class": "priority_class",
}


def _finite(value: float | None, name: str) -> float | None:
    if value is not None and not math.isfinite(value):
        raise ValidationError(f"{name} must be a finite number")
    return value


class DomainRow:
    """One domain on the new-run form: its checkbox and weight fields and why it cannot run."""

    def __init__(self, form: NewRunForm, domain: Domain, blockers: list[str]) -> None:
        self.domain = domain
        self.blockers = blockers
        self.use = form[f"use_{domain.pk}"]
        self.weight = form[f"weight_{domain.pk}"]


class NewRunForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Letters, digits, '.', '_' and '-'.")
    base_model = forms.ChoiceField(label="Base model")
    algorithm = forms.ChoiceField(
        label="Algorithm", choices=[(name, name) for name in ALGORITHM_PRESETS]
    )
    max_steps = forms.IntegerField(label="Steps", min_value=1)
    prompts_per_step = forms.IntegerField(label="Prompts per step", min_value=1)
    group_size = forms.IntegerField(label="Group size", min_value=1)
    lr = forms.FloatField(label="Learning rate")
    kl_coef = forms.FloatField(label="KL coefficient")
    kl_estimator = forms.ChoiceField(
        label="KL estimator",
        required=False,
        choices=[("", "the algorithm's default"), *[(name, name) for name in KL_ESTIMATORS]],
    )
    temperature = forms.FloatField(label="Temperature")
    max_new_tokens = forms.IntegerField(label="Max new tokens", min_value=1)
    tools = forms.BooleanField(label="Tools (tool calls run in sandboxes)", required=False)
    eval_every = forms.IntegerField(
        label="Evaluate every N steps",
        min_value=0,
        help_text="0: before the first step and at the end",
    )
    checkpoint_every = forms.IntegerField(
        label="Checkpoint every N steps", min_value=0, help_text="0: only on preempt and at the end"
    )
    ewc_strength = forms.FloatField(label="EWC strength", help_text="0: off")
    gpus = forms.IntegerField(
        label="GPUs", min_value=0, max_value=64, help_text="Per host. 0: a CPU slot"
    )
    hosts = forms.IntegerField(
        label="Hosts",
        required=False,
        min_value=1,
        max_value=64,
        initial=1,
        help_text="More than 1: the run starts on that many hosts at once, or waits.",
    )
    priority_class = forms.ChoiceField(
        label="Priority class",
        required=False,
        help_text="Higher classes are placed first (some may preempt).",
    )
    priority = forms.IntegerField(
        label="Priority within the class",
        required=False,
        min_value=-1000,
        max_value=1000,
        initial=0,
        help_text="Higher first; ties go in submission order.",
    )
    advanced = forms.CharField(
        label="Run spec sections (JSON or YAML), merged over the fields above",
        required=False,
        strip=False,
        max_length=MAX_ADVANCED_CHARS,
        widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false"}),
    )

    def __init__(
        self,
        *args: Any,
        models: list[ModelVersion],
        domains: list[tuple[Domain, list[str]]],
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        from console.scheduling.selectors import class_choices

        self.fields["priority_class"].choices = class_choices()  # type: ignore[attr-defined]
        self.fields["base_model"].choices = [  # type: ignore[attr-defined]
            (f"{v.model.slug}@{v.number}", f"{v.model.slug} v{v.number}") for v in models
        ]
        self._domains = domains
        for domain, blockers in domains:
            # A domain that cannot run is disabled in the page only: a request that picks it
            # anyway gets the launch's own error at its path rather than being ignored.
            attrs = {"disabled": True} if blockers else {}
            self.fields[f"use_{domain.pk}"] = forms.BooleanField(
                required=False, label=domain.slug, widget=forms.CheckboxInput(attrs=attrs)
            )
            # No minimum here: the launch checks the weight and names it by its path.
            self.fields[f"weight_{domain.pk}"] = forms.FloatField(
                required=False,
                label=f"Weight of {domain.slug}",
                widget=forms.NumberInput(attrs={**attrs, "step": "any"}),
            )

    @property
    def domain_rows(self) -> list[DomainRow]:
        return [DomainRow(self, domain, blockers) for domain, blockers in self._domains]

    def main_fields(self) -> list[forms.BoundField]:
        names = [name for name in self.fields if not name.startswith(("use_", "weight_"))]
        return [self[name] for name in names if name not in {"name", "base_model", "advanced"}]

    def clean_advanced(self) -> dict[str, Any]:
        text = self.cleaned_data.get("advanced") or ""
        if not text.strip():
            return {}
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
            problem = getattr(error, "problem", None) or "not valid YAML or JSON"
            raise ValidationError(f"not valid JSON or YAML{where}: {problem}") from None
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ValidationError("must be an object of run spec sections, like {kl: {coef: 0.01}}")
        return value

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        for name in ("lr", "kl_coef", "temperature", "ewc_strength"):
            try:
                _finite(cleaned.get(name), str(self.fields[name].label or name))
            except ValidationError as error:
                self.add_error(name, error)
        for domain, _ in self._domains:
            weight = cleaned.get(f"weight_{domain.pk}")
            if weight is not None and not math.isfinite(weight):
                self.add_error(f"weight_{domain.pk}", "must be a finite number")
        return cleaned

    def document(self) -> dict[str, Any]:
        """The form's part of the launch document (merged over the default document, then the
        advanced box is merged over it)."""
        data = self.cleaned_data
        domains = []
        for domain, _ in self._domains:
            if data.get(f"use_{domain.pk}"):
                weight = data.get(f"weight_{domain.pk}")
                domains.append(
                    {
                        "domain": domain.slug,
                        "weight": domain.default_mix_weight if weight is None else weight,
                    }
                )
        kl: dict[str, Any] = {"coef": data["kl_coef"]}
        if data.get("kl_estimator"):
            kl["estimator"] = data["kl_estimator"]
        return {
            "name": data["name"],
            "base_model": data["base_model"],
            "domains": domains,
            "max_steps": data["max_steps"],
            "lr": data["lr"],
            "algorithm": {"algorithm": data["algorithm"]},
            "batch": {
                "prompts_per_step": data["prompts_per_step"],
                "group_size": data["group_size"],
            },
            "kl": kl,
            "sampling": {
                "temperature": data["temperature"],
                "max_new_tokens": data["max_new_tokens"],
            },
            "tools": {"enabled": data["tools"]},
            "eval": {"every_steps": data["eval_every"]},
            "checkpoint": {"every_steps": data["checkpoint_every"]},
            "ewc": {"strength": data["ewc_strength"]},
        }


def initial_from_document(document: dict[str, Any]) -> dict[str, Any]:
    """The form's initial values from a launch document (`launch.default_document`)."""
    algorithm = document.get("algorithm") or {}
    return {
        "name": document.get("name", ""),
        "base_model": document.get("base_model", ""),
        "algorithm": algorithm.get("algorithm", "grpo") if isinstance(algorithm, dict) else "grpo",
        "max_steps": document.get("max_steps", 10),
        "prompts_per_step": document.get("batch", {}).get("prompts_per_step", 8),
        "group_size": document.get("batch", {}).get("group_size", 4),
        "lr": document.get("lr", 1e-5),
        "kl_coef": document.get("kl", {}).get("coef", 0.0),
        "kl_estimator": document.get("kl", {}).get("estimator") or "",
        "temperature": document.get("sampling", {}).get("temperature", 1.0),
        "max_new_tokens": document.get("sampling", {}).get("max_new_tokens", 256),
        "tools": bool(document.get("tools", {}).get("enabled", False)),
        "eval_every": document.get("eval", {}).get("every_steps", 0),
        "checkpoint_every": document.get("checkpoint", {}).get("every_steps", 0),
        "ewc_strength": document.get("ewc", {}).get("strength", 0.0),
        "gpus": 0,
        "hosts": 1,
        "priority_class": "normal",
        "priority": 0,
    }


class PromoteForm(forms.Form):
    slug = forms.SlugField(max_length=64, help_text="A new model, or the next version of one.")
    title = forms.CharField(max_length=200, required=False)


class CommandForm(forms.Form):
    reason = forms.CharField(max_length=500, required=False)


class OverridesForm(forms.Form):
    """Live overrides: only what is filled in changes."""

    kl_coef = forms.FloatField(label="KL coefficient", required=False)
    temperature = forms.FloatField(label="Temperature", required=False)
    reason = forms.CharField(max_length=500, required=False)

    def __init__(self, *args: Any, domains: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.domain_names = domains
        for slug in domains:
            self.fields[f"weight_{slug}"] = forms.FloatField(
                label=f"Weight of {slug}", required=False
            )
        self.order_fields([f"weight_{slug}" for slug in domains])

    def payload(self) -> dict[str, Any]:
        data = self.cleaned_data
        payload: dict[str, Any] = {}
        weights = {
            slug: data[f"weight_{slug}"]
            for slug in self.domain_names
            if data.get(f"weight_{slug}") is not None
        }
        if weights:
            payload["domain_weights"] = weights
        if data.get("kl_coef") is not None:
            payload["kl_coef"] = data["kl_coef"]
        if data.get("temperature") is not None:
            payload["temperature"] = data["temperature"]
        return payload
