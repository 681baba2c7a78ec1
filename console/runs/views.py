"""Runs pages: the team's runs, launching one, a run's page (state, attempts, metrics, events,
checkpoints, logs, operator commands), models with their lineage, and the shared hosts.

Access goes through `console.accounts.access` (outsiders 404, annotators 403 on writes); each
view calls one service or selector and renders one template; htmx polling gets a named
partial of the same template.
"""

from __future__ import annotations

import re
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console.accounts.access import require_active_membership, require_team_role
from console.accounts.models import Membership, Role
from console.registry import selectors as registry_selectors
from console.registry.models import Domain
from console.runs import explorer, exports, forms, live, selectors, services
from console.runs.launch import LaunchError, default_document, merge
from console.runs.models import (
    Checkpoint,
    CommandKind,
    ModelVersion,
    Run,
    RunState,
    TrajectoryRecord,
)
from training.metrics import MAIN_METRICS

# The columns of the run page's metrics table (those a run has), then its evaluation columns.
METRIC_COLUMNS = ("reward/mean", "pass_rate", "response_length/mean", "actor/kl", "actor/entropy")
EVAL_COLUMNS = ("eval/reward/mean", "eval/reward/sem", "eval/pass_rate")
METRIC_ROWS = 20
EVENT_ROWS = 50
CHECKPOINT_ROWS = 20  # the newest; a run saving every 1,000 steps has 80 at step 80k
POLL_SECONDS = 3
# The compare page's colour per run, in order (the same list as COLORS in static/runs-charts.js).
COMPARE_COLOURS = (
    *("#2563eb", "#dc2626", "#059669", "#d97706"),
    *("#7c3aed", "#db2777", "#0891b2", "#4b5563"),
)

# --- access ---------------------------------------------------------------------------------


def _run_for(request: HttpRequest, pk: int, role: str = Role.ANNOTATOR) -> tuple[Run, Membership]:
    try:
        run = selectors.run_get(pk=pk)
    except Run.DoesNotExist:
        raise Http404("No such run") from None
    return run, require_team_role(request.user, run.team, role)


def _checkpoint_for(request: HttpRequest, pk: int, checkpoint_pk: int) -> Checkpoint:
    run, _ = _run_for(request, pk, Role.RESEARCHER)
    try:
        checkpoint = selectors.checkpoint_get(pk=checkpoint_pk)
    except Checkpoint.DoesNotExist:
        raise Http404("No such checkpoint") from None
    if checkpoint.run_id != run.pk:
        raise Http404("No such checkpoint")
    return checkpoint


def _model_version_for(request: HttpRequest, pk: int, number: int) -> ModelVersion:
    try:
        version = selectors.model_version_get(pk=pk, number=number)
    except ModelVersion.DoesNotExist:
        raise Http404("No such model version") from None
    require_team_role(request.user, version.model.team)
    return version


def _can_write(membership: Membership) -> bool:
    return membership.has_role(Role.RESEARCHER)


# --- the runs list --------------------------------------------------------------------------


@login_required
@require_GET
def run_list(request: HttpRequest) -> HttpResponse:
    """The team's runs with their progress, ETA, newest reward and a sparkline, filtered;
    `/ws/runs/` (consumers.RunListConsumer) keeps the rows live."""
    membership = require_active_membership(request)
    filters = selectors.RunListFilters.from_query(request.GET)
    runs = list(
        selectors.run_list_filtered(team=membership.team, filters=filters)[
            : selectors.RUN_LIST_LIMIT
        ]
    )
    context = {
        "runs": selectors.run_list_summaries(runs),
        "filters": filters,
        "state": filters.state,
        "states": RunState.choices,
        "launchers": selectors.run_list_launchers(team=membership.team),
        "team_id": membership.team_id,
        "can_write": _can_write(membership),
    }
    if request.htmx:  # type: ignore[attr-defined]
        return render(request, "runs/run_list.html#results", context)
    return render(request, "runs/run_list.html", context)


# --- launching ------------------------------------------------------------------------------


def _launchable_domains(team: Any) -> list[tuple[Domain, list[str]]]:
    domains = registry_selectors.domain_list(team=team)
    return [
        (
            domain,
            []
            if getattr(domain, "ready", False)
            else registry_selectors.domain_blockers(domain=domain),
        )
        for domain in domains
    ]


def _initial(models: list[ModelVersion], domains: list[tuple[Domain, list[str]]]) -> dict[str, Any]:
    model = f"{models[0].model.slug}@{models[0].number}" if models else ""
    ready = [
        (domain.slug, domain.default_mix_weight) for domain, blockers in domains if not blockers
    ]
    document = default_document(model=model, domains=ready)
    initial = forms.initial_from_document(document)
    chosen = {entry["domain"] for entry in document["domains"]}
    for domain, _ in domains:
        initial[f"use_{domain.pk}"] = domain.slug in chosen
        initial[f"weight_{domain.pk}"] = domain.default_mix_weight
    return initial


_DOMAIN_PATH = re.compile(r"^domains\[(\d+)\](?:\.(\w+))?")


def _apply_launch_errors(
    form: forms.NewRunForm, errors: dict[str, list[str]], document: dict[str, Any]
) -> list[str]:
    """Puts each error next to its field where there is one; returns every error as
    ``path: message`` for the list at the top of the form."""
    by_slug = {row.domain.slug: row.domain.pk for row in form.domain_rows}
    domains = document.get("domains")
    listed: list[Any] = domains if isinstance(domains, list) else []
    lines = []
    for path, problems in errors.items():
        for problem in problems:
            lines.append(f"{path}: {problem}" if path else problem)
        field = forms.FIELD_FOR_PATH.get(path) or forms.FIELD_FOR_PATH.get(path.split(".")[0])
        match = _DOMAIN_PATH.match(path)
        if match and int(match[1]) < len(listed) and isinstance(listed[int(match[1])], dict):
            pk = by_slug.get(str(listed[int(match[1])].get("domain")))
            if pk is not None:
                field = f"weight_{pk}" if match[2] == "weight" else f"use_{pk}"
        if field and field in form.fields:
            form.add_error(field, [f"{path}: {problem}" for problem in problems])
    return lines


@login_required
@require_http_methods(["GET", "POST"])
def run_create(request: HttpRequest) -> HttpResponse:
    membership = require_active_membership(request, Role.RESEARCHER)
    team = membership.team
    models = list(selectors.model_version_choices(team=team))
    domains = _launchable_domains(team)
    form = forms.NewRunForm(
        request.POST or None, initial=_initial(models, domains), models=models, domains=domains
    )
    context: dict[str, Any] = {"form": form, "launch_errors": [], "has_models": bool(models)}
    if request.method == "POST":
        if form.is_valid():
            base = default_document(model=form.cleaned_data["base_model"], domains=[])
            document = merge(merge(base, form.document()), form.cleaned_data["advanced"])
            try:
                run = services.run_launch(
                    actor=request.user,
                    team=team,
                    document=document,
                    gpus=form.cleaned_data["gpus"],
                    hosts=form.cleaned_data["hosts"] or 1,
                    priority_class=form.cleaned_data["priority_class"] or "",
                    priority=form.cleaned_data["priority"] or 0,
                )
            except LaunchError as error:
                context["launch_errors"] = _apply_launch_errors(form, error.errors, document)
            else:
                messages.success(request, f"Run {run.name} queued.")
                return redirect("runs:run_detail", pk=run.pk)
        return render(request, "runs/run_new.html", context, status=422)
    return render(request, "runs/run_new.html", context)


# --- one run --------------------------------------------------------------------------------


def _metric_table(run: Run) -> dict[str, Any]:
    rows = selectors.run_metrics_newest(run=run, limit=METRIC_ROWS)
    present = set().union(*(row.values for row in rows)) if rows else set()
    columns = [key for key in (*METRIC_COLUMNS, *MAIN_METRICS) if key in present]
    columns = list(dict.fromkeys(columns))[:6]
    eval_columns = [key for key in EVAL_COLUMNS if key in present]
    return {
        "metric_columns": columns,
        "metric_rows": [
            {"step": row.step, "values": [row.values.get(key) for key in columns]}
            for row in rows
            if any(key in row.values for key in columns)
        ],
        "eval_columns": eval_columns,
        "eval_rows": [
            {"step": row.step, "values": [row.values.get(key) for key in eval_columns]}
            for row in rows
            if any(key in row.values for key in eval_columns)
        ],
    }


def _live_context(run: Run) -> dict[str, Any]:
    """The header's facts (also the htmx part the page refetches when an event comes)."""
    attempts = list(selectors.run_attempts(run=run))
    selectors.run_list_summaries([run])  # its ETA and newest reward
    # Every host any attempt ran on (a gang's nodes in node order).
    hosts = list(
        dict.fromkeys(node.host.name for attempt in attempts for node in attempt.allocations.all())
    )
    return {
        "run": run,
        "attempts": attempts,
        "attempt": attempts[-1] if attempts else None,
        "hosts": hosts,
        "policy_version": selectors.run_policy_version(run=run),
        "in_force": selectors.run_values_in_force(run=run),
        "trajectory_count": selectors.run_trajectory_count(run=run),
        "poll_seconds": POLL_SECONDS,
    }


@login_required
@require_GET
def run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    run, membership = _run_for(request, pk)
    if request.htmx and request.GET.get("part") == "live":  # type: ignore[attr-defined]
        if run.is_terminal:
            # The run just ended: the whole page (checkpoints, events, logs, the buttons)
            # changes, not only this part, so htmx reloads it.
            response = HttpResponse(status=204)
            response["HX-Refresh"] = "true"
            return response
        return render(request, "runs/run_detail.html#live", _live_context(run))
    domains = [entry["slug"] for entry in run.pins.get("domains", [])]
    live_context = _live_context(run)
    checkpoints, older_checkpoints = selectors.run_checkpoints_newest(
        run=run, limit=CHECKPOINT_ROWS
    )
    context = {
        **live_context,
        **_metric_table(run),
        "pins": run.pins.get("domains", []),
        "events": selectors.run_events_newest(run=run, limit=EVENT_ROWS),
        "checkpoints": checkpoints,
        "older_checkpoints": older_checkpoints,
        "can_write": _can_write(membership),
        "promote_form": forms.PromoteForm(),
        "command_form": forms.CommandForm(),
        "overrides_form": _overrides_form(domains, live_context["in_force"]),
    }
    return render(request, "runs/run_detail.html", context)


def _overrides_form(domains: list[str], in_force: dict[str, Any]) -> forms.OverridesForm:
    """The live-edit form, each empty field showing the value in force as its placeholder."""
    form = forms.OverridesForm(domains=domains)
    now = {f"weight_{slug}": weight for slug, weight in in_force["domain_weights"].items()}
    now.update(kl_coef=in_force["kl_coef"], temperature=in_force["temperature"])
    for name, value in now.items():
        if name in form.fields and value is not None:
            form.fields[name].widget.attrs["placeholder"] = f"now {value}"
    return form


@login_required
@require_POST
def run_command(request: HttpRequest, pk: int, kind: str) -> HttpResponse:
    """Cancel or preempt (the page asks for confirmation first)."""
    run, _ = _run_for(request, pk, Role.RESEARCHER)
    if kind not in (CommandKind.CANCEL, CommandKind.PREEMPT):
        raise Http404("No such command")
    form = forms.CommandForm(request.POST)
    reason = form.cleaned_data["reason"] if form.is_valid() else ""
    try:
        services.run_command(actor=request.user, run=run, kind=kind, reason=reason)
    except ValueError as error:
        messages.error(request, f"Not done: {error}.")
    except ValidationError as error:
        messages.error(request, "Not done: " + "; ".join(error.messages))
    else:
        done = "Cancel" if kind == CommandKind.CANCEL else "Preemption"
        messages.success(request, f"{done} requested.")
    return redirect("runs:run_detail", pk=run.pk)


@login_required
@require_POST
def run_overrides(request: HttpRequest, pk: int) -> HttpResponse:
    run, _ = _run_for(request, pk, Role.RESEARCHER)
    domains = [entry["slug"] for entry in run.pins.get("domains", [])]
    form = forms.OverridesForm(request.POST, domains=domains)
    if not form.is_valid():
        problems = "; ".join(
            f"{form.fields[name].label if name in form.fields else name}: "
            f"{' '.join(str(e) for e in errors)}"
            for name, errors in form.errors.items()
        )
        messages.error(request, f"Not changed: {problems}")
        return redirect("runs:run_detail", pk=run.pk)
    try:
        services.run_command(
            actor=request.user,
            run=run,
            kind=CommandKind.OVERRIDES,
            payload=form.payload(),
            reason=form.cleaned_data["reason"],
        )
    except ValueError as error:
        messages.error(request, f"Not changed: {error}.")
    except ValidationError as error:
        messages.error(request, "Not changed: " + "; ".join(error.messages))
    else:
        messages.success(request, "Overrides sent; the run applies them at its next step.")
    return redirect("runs:run_detail", pk=run.pk)


@login_required
@require_POST
def checkpoint_promote(request: HttpRequest, pk: int, checkpoint_pk: int) -> HttpResponse:
    checkpoint = _checkpoint_for(request, pk, checkpoint_pk)
    form = forms.PromoteForm(request.POST)
    if not form.is_valid():
        problems = "; ".join(
            f"{name}: {' '.join(str(e) for e in errors)}" for name, errors in form.errors.items()
        )
        messages.error(request, f"Not promoted: {problems}")
        return redirect("runs:run_detail", pk=pk)
    try:
        version = services.checkpoint_promote(
            actor=request.user,
            checkpoint=checkpoint,
            slug=form.cleaned_data["slug"],
            title=form.cleaned_data["title"],
        )
    except ValidationError as error:
        messages.error(request, "Not promoted: " + "; ".join(error.messages))
        return redirect("runs:run_detail", pk=pk)
    messages.success(request, f"Step {checkpoint.step} is now model {version}.")
    return redirect("runs:model_version", pk=version.model_id, number=version.number)


# --- models and hosts -----------------------------------------------------------------------


@login_required
@require_GET
def model_list(request: HttpRequest) -> HttpResponse:
    membership = require_active_membership(request)
    context = {"models": selectors.model_list_with_lineage(team=membership.team)}
    return render(request, "runs/model_list.html", context)


@login_required
@require_GET
def model_version(request: HttpRequest, pk: int, number: int) -> HttpResponse:
    version = _model_version_for(request, pk, number)
    context = {"version": version, "lineage": services.model_lineage(version)}
    return render(request, "runs/model_version.html", context)


@login_required
@require_GET
def host_list(request: HttpRequest) -> HttpResponse:
    membership = require_active_membership(request)
    context = {"hosts": selectors.host_list_with_live_nodes(), "team_id": membership.team_id}
    return render(request, "runs/host_list.html", context)


@login_required
@require_GET
def run_export(request: HttpRequest, pk: int, what: str) -> StreamingHttpResponse:
    """The run's trajectories (JSONL or Parquet) or metrics (CSV), streamed, for any member."""
    run, _ = _run_for(request, pk)
    if what == "trajectories":
        response = StreamingHttpResponse(
            exports.trajectories_jsonl(run), content_type="application/x-ndjson"
        )
        name = f"run-{run.pk}-trajectories.jsonl"
    elif what == "parquet":
        response = StreamingHttpResponse(
            exports.trajectories_parquet(run), content_type="application/vnd.apache.parquet"
        )
        name = f"run-{run.pk}-trajectories.parquet"
    else:
        response = StreamingHttpResponse(exports.metrics_csv(run), content_type="text/csv")
        name = f"run-{run.pk}-metrics.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


# --- comparing runs -------------------------------------------------------------------------


@login_required
@require_GET
def run_compare(request: HttpRequest) -> HttpResponse:
    """Two or more runs of one team overlaid on the same charts (`?ids=1,2,3`). A run the user
    may not see answers 404 as if it did not exist; bad ids are a 400 saying why."""
    membership = require_active_membership(request)
    values = request.GET.getlist("ids")
    context: dict[str, Any] = {
        "error": "",
        "runs": [],
        "compare": [],
        "max_runs": live.COMPARE_MAX_RUNS,
        "max_points": live.COMPARE_MAX_POINTS,
        # to pick from when no runs (or bad ids) were given
        "recent": selectors.run_list_filtered(
            team=membership.team, filters=selectors.RunListFilters()
        )[:50],
    }
    if not values:
        # From a run's page: that run comes ticked.
        context["ticked"] = {value for value in request.GET.getlist("with") if value.isdigit()}
        return render(request, "runs/run_compare.html", context)
    try:
        ids = live.parse_compare_ids(values)
    except ValueError as error:
        context["error"] = str(error)
        return render(request, "runs/run_compare.html", context, status=400)
    runs = selectors.runs_by_ids(ids=ids)
    if len(runs) != len(ids):
        raise Http404("No such run")
    for run in runs:
        require_team_role(request.user, run.team)
    if len({run.team_id for run in runs}) > 1:
        context["error"] = "runs of one team only can be compared"
        return render(request, "runs/run_compare.html", context, status=400)
    context["runs"] = runs
    context["runs_coloured"] = [
        (run, COMPARE_COLOURS[i % len(COMPARE_COLOURS)]) for i, run in enumerate(runs)
    ]
    context["compare"] = live.compare_series(runs)
    return render(request, "runs/run_compare.html", context)


# --- the trajectory explorer ----------------------------------------------------------------


@login_required
@require_GET
def trajectory_list(request: HttpRequest, pk: int) -> HttpResponse:
    """A run's trajectories, newest steps first, filtered, paged by a (step, index) cursor;
    htmx swaps the table when the filters change."""
    run, _ = _run_for(request, pk)
    filters = explorer.Filters.from_query(request.GET)
    after = explorer.parse_cursor(request.GET.get("after"))
    page = explorer.trajectory_page(run, filters, after=after)
    context = {
        "run": run,
        "filters": filters,
        "page": page,
        "first_query": filters.query(),
        "next_query": filters.query(after=page.next_cursor) if page.next_cursor else "",
        "domains": explorer.run_domains(run),
        "finish_reasons": explorer.FINISH_REASONS,
        "page_size": explorer.PAGE_SIZE,
        "completion_chars": explorer.COMPLETION_CHARS,
    }
    if request.htmx:  # type: ignore[attr-defined]
        return render(request, "runs/trajectories.html#table", context)
    return render(request, "runs/trajectories.html", context)


@login_required
@require_GET
def trajectory_group(request: HttpRequest, pk: int, step: int, group: int) -> HttpResponse:
    """One GRPO group side by side, with the advantages recomputed from its rewards."""
    run, _ = _run_for(request, pk)
    found = explorer.group_view(run, step, group)
    if found is None:
        raise Http404("No such group")
    context = {"run": run, "group": found, "epsilon": explorer.ADVANTAGE_EPSILON}
    return render(request, "runs/trajectory_group.html", context)


@login_required
@require_GET
def trajectory_detail(request: HttpRequest, pk: int, step: int, index: int) -> HttpResponse:
    """One sample: the chat, the sandbox observations, the reward breakdown, provenance, and
    the same task's other samples of the run."""
    run, _ = _run_for(request, pk)
    try:
        record = explorer.sample_get(run, step, index)
    except TrajectoryRecord.DoesNotExist:
        raise Http404("No such trajectory") from None
    context = {
        "run": run,
        "record": record,
        **explorer.sample_view(run, record),
        "same_task": explorer.same_task(run, record),
    }
    return render(request, "runs/trajectory_detail.html", context)
