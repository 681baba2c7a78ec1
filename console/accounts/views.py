"""Team switching, API tokens and member management. Access goes through accounts.access."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.forms import Form
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from console.accounts import services
from console.accounts.access import (
    SESSION_TEAM_KEY,
    membership_for,
    require_active_membership,
)
from console.accounts.forms import ApiTokenForm, MemberAddForm, MemberRoleForm, TeamSwitchForm
from console.accounts.models import ApiToken, Membership, Role
from console.accounts.selectors import team_members, user_api_tokens
from console.accounts.throttle import client_address, login_wait_s, wait_message


def _add_errors(form: Form, error: ValidationError) -> None:
    if hasattr(error, "error_dict"):
        for field, errors in error.error_dict.items():
            form.add_error(field if field in form.fields else None, errors)
    else:
        form.add_error(None, error)


class LoginView(auth_views.LoginView):
    """Django's login, saying clearly (429) when the throttle refuses, before any password is
    checked. The throttle itself lives in the authentication backend, which refuses such a
    login on every form, this one included."""

    redirect_authenticated_user = True

    def post(self, request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        wait_s = login_wait_s(
            username=request.POST.get("username"), address=client_address(request)
        )
        if wait_s > 0:
            # An unbound form: binding it would run the password check this refusal skips.
            form = self.get_form_class()(
                request, initial={"username": request.POST.get("username")}
            )
            context = self.get_context_data(form=form, throttled=wait_message(wait_s))
            response = self.render_to_response(context, status=429)
            response["Retry-After"] = str(wait_s)
            return response
        return super().post(request, *args, **kwargs)


@login_required
@require_POST
def team_switch(request: HttpRequest) -> HttpResponse:
    """Make another of the user's teams the one they work in (kept in the session)."""
    form = TeamSwitchForm(request.POST)
    if not form.is_valid():
        raise Http404("No such team")
    membership = membership_for(request.user, form.cleaned_data["team"])
    if membership is None:
        raise Http404("No such team")
    request.session[SESSION_TEAM_KEY] = membership.team_id
    next_url = request.POST.get("next") or "/"
    if not url_has_allowed_host_and_scheme(
        next_url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        next_url = "/"
    return redirect(next_url)


@login_required
def token_list(request: HttpRequest) -> HttpResponse:
    """The user's API tokens; POST creates one in the active team and shows its secret once."""
    membership = require_active_membership(request)
    form = ApiTokenForm(request.POST or None)
    new_secret = None
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                token, new_secret = services.api_token_create(
                    user=request.user, team=membership.team, name=form.cleaned_data["name"]
                )
            except ValidationError as error:
                _add_errors(form, error)
            else:
                form = ApiTokenForm()
        if form.errors:
            status = 400
    context = {"form": form, "tokens": user_api_tokens(user=request.user), "new_secret": new_secret}
    # The secret travels in this one response only: never cache it.
    response = render(request, "accounts/token_list.html", context, status=status)
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    # Another user's token is as good as absent.
    token = get_object_or_404(ApiToken, pk=token_id, user=request.user)
    services.api_token_revoke(user=request.user, token=token)
    messages.success(request, f"Token “{token.name}” revoked.")
    return redirect("accounts:tokens")


@login_required
def member_list(request: HttpRequest) -> HttpResponse:
    """Members of the active team; admins add people, change roles and remove them here."""
    membership = require_active_membership(request, Role.ADMIN)
    form = MemberAddForm(request.POST or None)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                services.membership_add(
                    actor=request.user,
                    team=membership.team,
                    username=form.cleaned_data["username"],
                    role=form.cleaned_data["role"],
                )
            except ValidationError as error:
                _add_errors(form, error)
            else:
                messages.success(request, f"Added {form.cleaned_data['username']}.")
                return redirect("accounts:members")
        status = 400
    context = {
        "form": form,
        "members": team_members(team=membership.team),
        "roles": Role.choices,
    }
    return render(request, "accounts/member_list.html", context, status=status)


def _member_of_active_team(request: HttpRequest, member_id: int) -> Membership:
    membership = require_active_membership(request, Role.ADMIN)
    return get_object_or_404(Membership, pk=member_id, team=membership.team)


@login_required
@require_POST
def member_change_role(request: HttpRequest, member_id: int) -> HttpResponse:
    member = _member_of_active_team(request, member_id)
    form = MemberRoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose a role.")
        return redirect("accounts:members")
    try:
        services.membership_change_role(
            actor=request.user, membership=member, role=form.cleaned_data["role"]
        )
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.success(
            request, f"{member.user.get_username()} is now {form.cleaned_data['role']}."
        )
    return redirect("accounts:members")


@login_required
@require_POST
def member_remove(request: HttpRequest, member_id: int) -> HttpResponse:
    member = _member_of_active_team(request, member_id)
    try:
        services.membership_remove(actor=request.user, membership=member)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.success(request, f"Removed {member.user.get_username()}.")
    return redirect("accounts:members")
