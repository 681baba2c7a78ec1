"""The scheduler's pages: the queue, the fleet (cordon, drain, uncordon, a host's pool),
priority classes, pools and quotas, and the preemption inbox.

Who may do what: the fleet is shared by every team, so its writes, the classes and quotas
and the preemption inbox are for admins (of the active team); members see their own team's
queue and the fleet with other teams' runs unnamed. The queue, the fleet and the inbox are
live: their websockets (`console.scheduling.consumers`) ring after each commit that changes
them, and the page re-reads its part (`#queue`, `#hosts`, `#inbox`) through these views, so
what a socket makes a page show is exactly what the view lets that user see.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console.accounts.access import require_active_membership
from console.accounts.models import Membership, Role, Team
from console.runs.models import Host
from console.scheduling import forms, selectors, services
from console.scheduling.models import PreemptionRequest, PriorityClass, ResourcePool


def _admin(request: HttpRequest) -> Membership:
    return require_active_membership(request, Role.ADMIN)


def _partial(request: HttpRequest, template: str, part: str) -> str:
    if getattr(request, "htmx", False) and not request.htmx.boosted:  # type: ignore[attr-defined]
        return f"{template}#{part}"
    return template


def _form_errors(form: Any, error: ValidationError) -> None:
    for field, problems in error.message_dict.items():
        form.add_error(field if field in form.fields else None, problems)


def _saved(
    request: HttpRequest, form: Any, save: Callable[[], Any], done: Callable[[Any], str], to: str
) -> HttpResponse | None:
    """The writes' one pattern: when `form` is valid, `save()` (a service call); once it saved,
    `done(result)` as a success message and a redirect to `to`. None when the form or the
    service refused: the form then carries the service's errors (on their fields, else on the
    form) and the caller shows it again with 422, so nothing typed is lost."""
    if not form.is_valid():
        return None
    try:
        result = save()
    except ValidationError as error:
        _form_errors(form, error)
        return None
    messages.success(request, done(result))
    return redirect(to)


# --- queue and fleet ------------------------------------------------------------------------


@login_required
@require_GET
def queue(request: HttpRequest) -> HttpResponse:
    membership = require_active_membership(request)
    is_admin = membership.has_role(Role.ADMIN)
    data = selectors.queue(team=None if is_admin else membership.team)
    context = {"queue": data, "is_admin": is_admin}
    return render(request, _partial(request, "scheduling/queue.html", "queue"), context)


@login_required
@require_GET
def fleet(request: HttpRequest) -> HttpResponse:
    membership = require_active_membership(request)
    rows = selectors.fleet()
    context = {
        "rows": rows,
        "totals": selectors.fleet_totals(rows),
        "is_admin": membership.has_role(Role.ADMIN),
        "team_id": membership.team_id,
        "pools": [p.name for p in selectors.pool_list()],
    }
    return render(request, _partial(request, "scheduling/fleet.html", "hosts"), context)


def _host(pk: int) -> Host:
    try:
        return selectors.host_get(pk=pk)
    except Host.DoesNotExist:
        raise Http404("No such host") from None


@login_required
@require_POST
def host_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    membership = _admin(request)
    host = _host(pk)
    form = forms.ReasonForm(request.POST)
    reason = form.cleaned_data["reason"] if form.is_valid() else ""
    try:
        services.host_act(
            actor=request.user, team=membership.team, host=host, action=action, reason=reason
        )
    except ValidationError as error:
        messages.error(request, f"{host.name}: {'; '.join(error.messages)}")
    else:
        messages.success(request, f"{host.name}: {action} done.")
    return redirect("scheduling:fleet")


@login_required
@require_POST
def host_pool(request: HttpRequest, pk: int) -> HttpResponse:
    membership = _admin(request)
    host = _host(pk)
    form = forms.HostPoolForm(request.POST, pools=[p.name for p in selectors.pool_list()])
    if not form.is_valid():
        messages.error(request, f"{host.name}: pick one of the pools")
        return redirect("scheduling:fleet")
    pool = ResourcePool.objects.get(name=form.cleaned_data["pool"])
    services.host_set_pool(actor=request.user, team=membership.team, host=host, pool=pool)
    messages.success(request, f"{host.name} is now in pool {pool.name}.")
    return redirect("scheduling:fleet")


# --- classes, pools and quotas --------------------------------------------------------------


def _quota_form(data: Any = None) -> forms.QuotaForm:
    return forms.QuotaForm(
        data,
        teams=[(t.slug, t.name) for t in selectors.team_list()],
        pools=[p.name for p in selectors.pool_list()],
    )


def _classes_page(
    request: HttpRequest,
    *,
    class_form: forms.PriorityClassForm | None = None,
    pool_form: forms.PoolForm | None = None,
    quota_form: forms.QuotaForm | None = None,
    status: int = 200,
) -> HttpResponse:
    services.default_class()
    services.default_pool()
    context = {
        "classes": selectors.class_list(),
        "pools": selectors.pool_list().prefetch_related("hosts"),
        "quotas": selectors.quota_list(),
        "class_form": class_form or forms.PriorityClassForm(initial={"preemptible": True}),
        "pool_form": pool_form or forms.PoolForm(),
        "quota_form": quota_form or _quota_form(),
    }
    return render(request, "scheduling/classes.html", context, status=status)


@login_required
@require_GET
def classes(request: HttpRequest) -> HttpResponse:
    _admin(request)
    return _classes_page(request)


@login_required
@require_POST
def class_create(request: HttpRequest) -> HttpResponse:
    membership = _admin(request)
    form = forms.PriorityClassForm(request.POST)
    saved = _saved(
        request,
        form,
        lambda: services.class_save(actor=request.user, team=membership.team, values=form.values()),
        lambda cls: f"Class {cls.name} created.",
        "scheduling:classes",
    )
    return saved or _classes_page(request, class_form=form, status=422)


def _class(pk: int) -> PriorityClass:
    cls = PriorityClass.objects.filter(pk=pk).first()
    if cls is None:
        raise Http404("No such priority class")
    return cls


@login_required
@require_http_methods(["GET", "POST"])
def class_edit(request: HttpRequest, pk: int) -> HttpResponse:
    membership = _admin(request)
    cls = _class(pk)
    initial = {name: getattr(cls, name) for name in services.CLASS_FIELDS}
    form = forms.PriorityClassForm(request.POST or None, initial=initial)
    status = 200
    if request.method == "POST":
        saved = _saved(
            request,
            form,
            lambda: services.class_save(
                actor=request.user, team=membership.team, values=form.values(), instance=cls
            ),
            lambda _: f"Class {cls.name} saved.",
            "scheduling:classes",
        )
        if saved is not None:
            return saved
        status = 422
    return render(request, "scheduling/class_edit.html", {"form": form, "cls": cls}, status=status)


@login_required
@require_POST
def class_delete(request: HttpRequest, pk: int) -> HttpResponse:
    membership = _admin(request)
    cls = _class(pk)
    try:
        services.class_delete(actor=request.user, team=membership.team, cls=cls)
    except ValidationError as error:
        messages.error(request, f"Class {cls.name}: {'; '.join(error.messages)}")
    else:
        messages.success(request, f"Class {cls.name} deleted.")
    return redirect("scheduling:classes")


@login_required
@require_POST
def pool_create(request: HttpRequest) -> HttpResponse:
    membership = _admin(request)
    form = forms.PoolForm(request.POST)
    saved = _saved(
        request,
        form,
        lambda: services.pool_create(
            actor=request.user,
            team=membership.team,
            name=form.cleaned_data["name"],
            description=form.cleaned_data["description"],
        ),
        lambda pool: f"Pool {pool.name} created.",
        "scheduling:classes",
    )
    return saved or _classes_page(request, pool_form=form, status=422)


@login_required
@require_POST
def quota_set(request: HttpRequest) -> HttpResponse:
    membership = _admin(request)
    form = _quota_form(request.POST)

    def save() -> tuple[Team, ResourcePool]:
        team = Team.objects.get(slug=form.cleaned_data["team"])
        pool = ResourcePool.objects.get(name=form.cleaned_data["pool"])
        services.quota_set(
            actor=request.user,
            team=membership.team,
            quota_team=team,
            pool=pool,
            gpus=form.cleaned_data["gpus"],
        )
        return team, pool

    saved = _saved(
        request,
        form,
        save,
        lambda saved: f"Quota of {saved[0].name} in {saved[1].name} saved.",
        "scheduling:classes",
    )
    return saved or _classes_page(request, quota_form=form, status=422)


# --- the preemption inbox -------------------------------------------------------------------


@login_required
@require_GET
def inbox(request: HttpRequest) -> HttpResponse:
    _admin(request)
    pending, decided = selectors.preemption_inbox()
    context = {"pending": pending, "decided": decided, "reject_form": forms.RejectForm()}
    return render(request, _partial(request, "scheduling/inbox.html", "inbox"), context)


def _preemption(pk: int) -> PreemptionRequest:
    try:
        return selectors.preemption_get(pk=pk)
    except PreemptionRequest.DoesNotExist:
        raise Http404("No such preemption request") from None


@login_required
@require_POST
def preemption_approve(request: HttpRequest, pk: int) -> HttpResponse:
    _admin(request)
    preemption = _preemption(pk)
    try:
        services.preemption_approve(actor=request.user, request=preemption)
    except ValidationError as error:
        messages.error(request, f"Request #{pk}: {'; '.join(error.messages)}")
    else:
        messages.success(request, f"Request #{pk} approved: the victims checkpoint and stop.")
    return redirect("scheduling:inbox")


@login_required
@require_POST
def preemption_reject(request: HttpRequest, pk: int) -> HttpResponse:
    _admin(request)
    preemption = _preemption(pk)
    form = forms.RejectForm(request.POST)
    saved = _saved(
        request,
        form,
        lambda: services.preemption_reject(
            actor=request.user, request=preemption, reason=form.cleaned_data["reason"]
        ),
        lambda _: f"Request #{pk} rejected; the victims keep running.",
        "scheduling:inbox",
    )
    if saved is not None:
        return saved
    pending, decided = selectors.preemption_inbox()
    context = {
        "pending": pending,
        "decided": decided,
        "reject_form": forms.RejectForm(),
        "failed_form": form,
        "failed_pk": pk,
    }
    return render(request, "scheduling/inbox.html", context, status=422)
