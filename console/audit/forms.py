from __future__ import annotations

from django import forms

from console.audit.selectors import AuditFilters


class AuditFilterForm(forms.Form):
    """Filters from the query string. Choices are filled from the team's own log."""

    actor = forms.ChoiceField(required=False)
    action = forms.ChoiceField(required=False)
    target_type = forms.ChoiceField(required=False, label="Target type")
    target_id = forms.CharField(required=False, max_length=64, widget=forms.HiddenInput)
    since = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))

    def __init__(self, *args: object, choices: dict[str, list[str]], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        for name, values in choices.items():
            field = self.fields[name]
            assert isinstance(field, forms.ChoiceField)
            field.choices = [("", "any")] + [(value, value) for value in values]

    def clean(self) -> dict[str, object]:
        cleaned = super().clean() or {}
        since, until = cleaned.get("since"), cleaned.get("until")
        if since and until and since > until:
            self.add_error("until", "Must be on or after the start date.")
        return cleaned

    def filters(self) -> AuditFilters:
        """The valid filters; an invalid field filters nothing (its error is shown)."""
        data = self.cleaned_data if hasattr(self, "cleaned_data") else {}
        return AuditFilters(
            actor=data.get("actor") or "",
            action=data.get("action") or "",
            target_type=data.get("target_type") or "",
            target_id=data.get("target_id") or "",
            since=data.get("since") if "since" not in self.errors else None,
            until=data.get("until") if "until" not in self.errors else None,
        )
