"""Forms only parse and check input; the services write."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from console.accounts.models import Team
from console.registry import selectors, specs
from console.registry.models import (
    FRACTIONAL_LIMITS,
    LIMIT_BOUNDS,
    SandboxDriver,
    SandboxNetwork,
    SpecFormat,
    format_bound,
)
from console.registry.services import sandbox_version_problems
from sandboxes import LIMITS as SANDBOX_LIMITS

SLUG_HELP = "Lowercase letters, digits, '-' and '_'; unique in your team."


class VersionedChoiceField(forms.ModelChoiceField):
    """A rubric or image to point a domain at; one with nothing published yet says so, since a
    run cannot use it until then (the choice is still allowed: a draft may be published later)."""

    def label_from_instance(self, obj: Any) -> str:
        if getattr(obj, "has_published", True):
            return str(obj.slug)
        return f"{obj.slug} (no published version yet: cannot run)"


class DomainForm(forms.Form):
    slug = forms.SlugField(max_length=64, help_text=SLUG_HELP)
    title = forms.CharField(max_length=200)
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False)
    default_mix_weight = forms.FloatField(
        min_value=0, initial=1.0, help_text="Share of this domain in a run's mix (≥ 0)."
    )
    rubric: forms.ModelChoiceField = VersionedChoiceField(
        queryset=None, required=False, empty_label="— none —"
    )
    sandbox_image: forms.ModelChoiceField = VersionedChoiceField(
        queryset=None, required=False, empty_label="— none —"
    )

    def __init__(self, *args: Any, team: Team, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Only this team's objects can be chosen: another team's id is "not a valid choice".
        self.fields["rubric"].queryset = selectors.rubric_choices(team=team)  # type: ignore[attr-defined]
        self.fields["sandbox_image"].queryset = selectors.sandbox_image_choices(team=team)  # type: ignore[attr-defined]

    def clean_default_mix_weight(self) -> float:
        weight = self.cleaned_data["default_mix_weight"]
        if weight != weight or weight == float("inf"):
            raise ValidationError("must be a finite number ≥ 0")
        return weight


class TaskUploadForm(forms.Form):
    file = forms.FileField(help_text="JSONL, UTF-8: one task per line.")
    held_out_fraction = forms.FloatField(
        min_value=0,
        max_value=1,
        initial=0.1,
        help_text="Each task is held out with this probability, decided by a hash of the seed "
        "and its position (the same file and seed always give the same split); 0–1.",
    )
    split_seed = forms.IntegerField(initial=0, min_value=-(2**63), max_value=2**63 - 1)
    keep_valid_rows = forms.BooleanField(
        required=False, label="Keep the valid rows if some rows are invalid"
    )


class ResplitForm(forms.Form):
    held_out_fraction = forms.FloatField(min_value=0, max_value=1, label="Held-out fraction")
    split_seed = forms.IntegerField(min_value=-(2**63), max_value=2**63 - 1, label="Seed")


class VersionedMetaForm(forms.Form):
    """The name of any versioned object (rubric, sandbox image): its versions are edited apart."""

    slug = forms.SlugField(max_length=64, help_text=SLUG_HELP)
    title = forms.CharField(max_length=200)
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)


RubricMetaForm = VersionedMetaForm


class RubricSourceForm(forms.Form):
    source_format = forms.ChoiceField(choices=SpecFormat.choices, initial=SpecFormat.YAML)
    source = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 18, "spellcheck": "false"}),
        strip=False,
        max_length=specs.MAX_SOURCE_CHARS,
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.issues: list[specs.Issue] = []

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if "source" in cleaned and "source_format" in cleaned:
            spec, self.issues = specs.check_rubric_source(
                cleaned["source"], cleaned["source_format"]
            )
            if self.issues:
                self.add_error("source", [str(issue) for issue in self.issues])
            cleaned["spec"] = spec
        return cleaned


class RubricCreateForm(RubricMetaForm, RubricSourceForm):
    field_order = ["slug", "title", "description", "source_format", "source"]


class TrySampleForm(forms.Form):
    prompt = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False, strip=False)
    completion = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}), strip=False, max_length=100_000
    )
    ground_truth = forms.CharField(
        required=False, strip=False, max_length=100_000, help_text="As text, as a task holds it."
    )


SandboxImageMetaForm = VersionedMetaForm


def _limit_field(name: str, label: str) -> forms.Field:
    low, high = LIMIT_BOUNDS[name]
    help_text = f"{SANDBOX_LIMITS[name].unit} ({format_bound(low)}–{format_bound(high)})"
    # min/max come from the sandboxes library's table, so the browser refuses what it refuses.
    if name in FRACTIONAL_LIMITS:
        return forms.FloatField(label=label, min_value=low, max_value=high, help_text=help_text)
    return forms.IntegerField(
        label=label, min_value=int(low), max_value=int(high), help_text=help_text
    )


class SandboxVersionForm(forms.Form):
    driver = forms.ChoiceField(choices=SandboxDriver.choices, initial=SandboxDriver.BWRAP)
    image_ref = forms.CharField(
        label="Image reference or base",
        max_length=500,
        required=False,
        help_text="podman/docker: an image such as python:3.11-slim. Leave empty for bwrap: "
        "its images are the host's read-only system plus the setup script.",
    )
    setup_script = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 5, "spellcheck": "false"}), required=False, strip=False
    )
    cpu = _limit_field("cpu", "CPUs")
    memory_mb = _limit_field("memory_mb", "Memory (MB)")
    pids = _limit_field("pids", "Processes")
    disk_mb = _limit_field("disk_mb", "Disk (MB)")
    timeout_s = _limit_field("timeout_s", "Timeout (s)")
    network = forms.ChoiceField(choices=SandboxNetwork.choices, initial=SandboxNetwork.NONE)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        # The same checks the service makes, run only on fields that parsed, so each field shows
        # one clear message.
        if not self.errors:
            for name, messages in sandbox_version_problems(cleaned).items():
                self.add_error(name, messages)
        return cleaned

    def version_values(self) -> dict[str, Any]:
        return {name: self.cleaned_data[name] for name in self.fields}


class SandboxImageCreateForm(SandboxImageMetaForm, SandboxVersionForm):
    field_order = ["slug", "title", "description", *SandboxVersionForm.base_fields]

    def version_values(self) -> dict[str, Any]:
        return {name: self.cleaned_data[name] for name in SandboxVersionForm.base_fields}
