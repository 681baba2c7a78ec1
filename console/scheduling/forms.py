"""Forms of the scheduler's admin pages. They check shapes; the services check the rest (and
their errors go back onto these forms' fields)."""

from __future__ import annotations

from typing import Any

from django import forms

from console.scheduling.models import Approval


class PriorityClassForm(forms.Form):
    name = forms.SlugField(max_length=64)
    value = forms.IntegerField(
        min_value=-(10**6), max_value=10**6, help_text="Higher classes are placed first."
    )
    can_preempt = forms.BooleanField(required=False, label="May preempt lower classes' runs")
    preemptible = forms.BooleanField(required=False, label="Its runs may be preempted")
    approval = forms.ChoiceField(
        choices=Approval.choices, help_text="When its runs would be preempted."
    )
    auto_approve_minutes = forms.FloatField(
        min_value=0,
        initial=0,
        label="Auto-approve when the victim checkpointed less than this many minutes ago",
    )
    preempt_after_wait_s = forms.IntegerField(
        required=False,
        min_value=0,
        max_value=7 * 86400,
        initial=0,
        label="Preempt only after waiting (s)",
        help_text="Its runs ask for a preemption only when they would otherwise wait longer "
        "than this (0: at once).",
    )
    grace_s = forms.IntegerField(
        min_value=1,
        max_value=86400,
        initial=60,
        label="Grace period (s)",
        help_text="A preempted job gets SIGTERM, then SIGKILL this much later.",
    )
    description = forms.CharField(max_length=500, required=False)

    def values(self) -> dict[str, Any]:
        values = dict(self.cleaned_data)
        values["preempt_after_wait_s"] = values.get("preempt_after_wait_s") or 0
        return values


class PoolForm(forms.Form):
    name = forms.SlugField(max_length=64)
    description = forms.CharField(max_length=500, required=False)


class QuotaForm(forms.Form):
    team = forms.ChoiceField()
    pool = forms.ChoiceField()
    gpus = forms.IntegerField(
        min_value=0, max_value=100000, label="Guaranteed GPUs", help_text="0 removes the quota."
    )

    def __init__(
        self, *args: Any, teams: list[tuple[str, str]], pools: list[str], **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.fields["team"].choices = teams  # type: ignore[attr-defined]
        self.fields["pool"].choices = [(p, p) for p in pools]  # type: ignore[attr-defined]


class HostPoolForm(forms.Form):
    pool = forms.ChoiceField()

    def __init__(self, *args: Any, pools: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["pool"].choices = [(p, p) for p in pools]  # type: ignore[attr-defined]


class RejectForm(forms.Form):
    reason = forms.CharField(max_length=1000, help_text="Shown to the requester's team.")


class ReasonForm(forms.Form):
    reason = forms.CharField(max_length=300, required=False)
