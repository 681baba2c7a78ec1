from __future__ import annotations

from django import forms

from console.accounts.models import Role


class ApiTokenForm(forms.Form):
    name = forms.CharField(
        max_length=100,
        help_text="What will use it, e.g. 'nightly eval script'.",
        widget=forms.TextInput(attrs={"placeholder": "nightly eval script"}),
    )


class MemberAddForm(forms.Form):
    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.RESEARCHER)


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class TeamSwitchForm(forms.Form):
    team = forms.IntegerField()
