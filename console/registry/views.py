"""Registry pages: domains (with task-set upload), reward rubrics, sandbox images.

Each view checks access through one helper per resource, calls one service or selector and
renders one template; htmx requests get a named partial of the same template. Forms validate
inline: an htmx POST carrying `_validate` re-renders the form with its errors and saves nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import BadRequest, ValidationError
from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.forms import Form
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console.accounts.access import require_active_membership, require_team_role
from console.accounts.models import Membership, Role
from console.registry import forms, scoring, selectors, services, specs
from console.registry.models import (
    Domain,
    RubricVersion,
    TaskSplit,
)
from console.registry.uploads import SizeLimitHandler

PAGE_SIZE = 25
TASK_PAGE_SIZE = 20

# --- access: one helper per resource -------------------------------------------------------------


def _domain_for(
    request: HttpRequest, pk: int, role: str = Role.ANNOTATOR
) -> tuple[Domain, Membership]:
    try:
        domain = selectors.domain_get(pk=pk)
    except Domain.DoesNotExist:
        raise Http404("No such domain") from None
    return domain, require_team_role(request.user, domain.team, role)


def _versioned_for(
    request: HttpRequest, kind: services.VersionedKind, pk: int, role: str = Role.ANNOTATOR
) -> tuple[Any, Membership]:
    try:
        obj = selectors.versioned_get(kind=kind, pk=pk)
    except kind.model.DoesNotExist:  # type: ignore[attr-defined]
        raise Http404(f"No such {kind.label}") from None
    return obj, require_team_role(request.user, obj.team, role)


def _version_for(
    request: HttpRequest,
    kind: services.VersionedKind,
    pk: int,
    number: int,
    role: str = Role.ANNOTATOR,
) -> tuple[Any, Membership]:
    obj, membership = _versioned_for(request, kind, pk, role)
    try:
        return selectors.versioned_version_get(kind=kind, obj=obj, number=number), membership
    except kind.version_model.DoesNotExist:  # type: ignore[attr-defined]
        raise Http404("No such version") from None


def _rubric_version_for(
    request: HttpRequest, pk: int, number: int, role: str = Role.ANNOTATOR
) -> tuple[RubricVersion, Membership]:
    return _version_for(request, services.RUBRIC, pk, number, role)  # type: ignore[return-value]


# --- helpers ------------------------------------------------------------------------------------


def _page(request: HttpRequest, items: QuerySet, size: int = PAGE_SIZE) -> Page:
    return Paginator(items, size).get_page(request.GET.get("page"))


MAX_SEARCH_CHARS = 200


def _search_query(request: HttpRequest) -> str:
    """The list's search terms; a NUL character is a 400 (PostgreSQL refuses it in a query)."""
    query = request.GET.get("q", "")
    if "\x00" in query:
        raise BadRequest("Search terms must not contain NUL characters.")
    return query[:MAX_SEARCH_CHARS]


def _validating(request: HttpRequest) -> bool:
    return bool(request.htmx) and request.POST.get("_validate") == "1"  # type: ignore[attr-defined]


def _form_response(request: HttpRequest, template: str, context: dict[str, Any]) -> HttpResponse:
    """For inline validation, only the form's error lists (swapped in by id, so nothing the
    user is typing is replaced); for a failed submit, the whole page with status 422."""
    if _validating(request):
        return render(request, "registry/_form_errors_oob.html", context)
    return render(request, template, context, status=422 if request.method == "POST" else 200)


def _apply_service_errors(form: Form, error: ValidationError) -> None:
    if hasattr(error, "error_dict"):
        for name, errors in error.error_dict.items():
            form.add_error(name if name in form.fields else None, errors)
    else:
        form.add_error(None, error)


def _can_edit(membership: Membership) -> bool:
    return membership.has_role(Role.RESEARCHER)


# --- overview -----------------------------------------------------------------------------------


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    membership = require_active_membership(request)
    return render(
        request,
        "registry/home.html",
        {
            "counts": selectors.registry_counts(team=membership.team),
            "can_edit": _can_edit(membership),
        },
    )


# --- domains ------------------------------------------------------------------------------------


@login_required
@require_GET
def domain_list(request: HttpRequest) -> HttpResponse:
    membership = require_active_membership(request)
    query = _search_query(request)
    page = _page(request, selectors.domain_list(team=membership.team, query=query))
    context = {"page": page, "q": query, "can_edit": _can_edit(membership)}
    if request.htmx:  # type: ignore[attr-defined]
        return render(request, "registry/domain_list.html#results", context)
    return render(request, "registry/domain_list.html", context)


def _domain_form_values(form: forms.DomainForm) -> dict[str, Any]:
    return {name: form.cleaned_data[name] for name in services.DOMAIN_EDITABLE}


@login_required
@require_http_methods(["GET", "POST"])
def domain_create(request: HttpRequest) -> HttpResponse:
    membership = require_active_membership(request, Role.RESEARCHER)
    team = membership.team
    form = forms.DomainForm(request.POST or None, team=team)
    context = {"form": form, "domain": None}
    if request.method == "POST" and form.is_valid() and not _validating(request):
        try:
            domain = services.domain_create(
                actor=request.user, team=team, **_domain_form_values(form)
            )
        except ValidationError as error:
            _apply_service_errors(form, error)
        else:
            messages.success(request, f"Domain {domain.slug} created. Upload its task set below.")
            return redirect("registry:domain_detail", pk=domain.pk)
    return _form_response(request, "registry/domain_form.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def domain_edit(request: HttpRequest, pk: int) -> HttpResponse:
    domain, _ = _domain_for(request, pk, Role.RESEARCHER)
    initial = {name: getattr(domain, name) for name in services.DOMAIN_EDITABLE}
    form = forms.DomainForm(request.POST or None, initial=initial, team=domain.team)
    context = {"form": form, "domain": domain}
    if request.method == "POST" and form.is_valid() and not _validating(request):
        try:
            services.domain_update(actor=request.user, domain=domain, **_domain_form_values(form))
        except ValidationError as error:
            _apply_service_errors(form, error)
        else:
            messages.success(request, "Domain saved.")
            return redirect("registry:domain_detail", pk=domain.pk)
    return _form_response(request, "registry/domain_form.html", context)


@login_required
@require_GET
def domain_detail(request: HttpRequest, pk: int) -> HttpResponse:
    domain, membership = _domain_for(request, pk)
    split = request.GET.get("split", "")
    if split not in TaskSplit.values:
        split = ""
    shown_version = _taskset_version_asked(request, domain)
    tasks = _page(
        request,
        selectors.domain_tasks(domain=domain, split=split, taskset_version=shown_version),
        TASK_PAGE_SIZE,
    )
    context = {
        "domain": domain,
        "shown_version": shown_version,
        # Set only when an older version is shown: the tabs and pager keep it in their links.
        "older_version": shown_version if shown_version != domain.taskset_version else None,
        "taskset_versions": selectors.domain_taskset_versions(domain=domain),
        "blockers": selectors.domain_blockers(domain=domain),
        "tasks": tasks,
        "split": split,
        "splits": TaskSplit.choices,
        "can_edit": _can_edit(membership),
        "upload_form": forms.TaskUploadForm(
            initial={"held_out_fraction": domain.held_out_fraction, "split_seed": domain.split_seed}
        ),
        "resplit_form": forms.ResplitForm(
            initial={"held_out_fraction": domain.held_out_fraction, "split_seed": domain.split_seed}
        ),
    }
    if request.htmx:  # type: ignore[attr-defined]
        return render(request, "registry/domain_detail.html#tasks", context)
    return render(request, "registry/domain_detail.html", context)


def _taskset_version_asked(request: HttpRequest, domain: Domain) -> int:
    """The task-set version `?taskset=` names (older ones stay readable: runs pin them), or the
    current one; anything but a version the domain has had is a 404."""
    asked = request.GET.get("taskset", "")
    if not asked:
        return domain.taskset_version
    if not asked.isdigit() or len(asked) > 9 or not (1 <= int(asked) <= domain.taskset_version):
        raise Http404("No such task-set version")
    return int(asked)


@csrf_exempt
@login_required
def domain_upload(request: HttpRequest, pk: int) -> HttpResponse:
    """Upload a task set. The size guard must be installed before anything reads the body, so
    this view turns off the CSRF middleware's early read and checks CSRF itself (the pattern in
    Django's upload-handler docs)."""
    domain, _ = _domain_for(request, pk, Role.RESEARCHER)
    limit = settings.TASKSET_MAX_UPLOAD_BYTES
    declared = request.META.get("CONTENT_LENGTH") or "0"
    if request.method == "POST" and declared.isdigit() and int(declared) > limit + 64 * 1024:
        return _upload_refused(request, domain, limit)
    guard = SizeLimitHandler(request, limit)
    request.upload_handlers.insert(0, guard)
    return _domain_upload(request, domain, guard)


def _upload_refused(request: HttpRequest, domain: Domain, limit: int) -> HttpResponse:
    context = {
        "domain": domain,
        "form": forms.TaskUploadForm(),
        "file_error": f"The file is larger than the limit of {limit:,} bytes "
        "(TASKSET_MAX_UPLOAD_BYTES); nothing was stored.",
    }
    return render(request, "registry/domain_upload.html", context, status=413)


@csrf_protect
@require_http_methods(["GET", "POST"])
def _domain_upload(request: HttpRequest, domain: Domain, guard: SizeLimitHandler) -> HttpResponse:
    if request.method == "GET":
        form = forms.TaskUploadForm(
            initial={"held_out_fraction": domain.held_out_fraction, "split_seed": domain.split_seed}
        )
        return render(request, "registry/domain_upload.html", {"domain": domain, "form": form})
    form = forms.TaskUploadForm(request.POST, request.FILES)
    if guard.exceeded:
        return _upload_refused(request, domain, guard.max_bytes)
    if not form.is_valid():
        return render(
            request, "registry/domain_upload.html", {"domain": domain, "form": form}, status=422
        )
    uploaded = form.cleaned_data["file"]
    uploaded.seek(0)
    result = services.domain_upload_tasks(
        actor=request.user,
        domain=domain,
        stream=uploaded.file,
        filename=uploaded.name or "tasks.jsonl",
        held_out_fraction=form.cleaned_data["held_out_fraction"],
        split_seed=form.cleaned_data["split_seed"],
        keep_valid_rows=form.cleaned_data["keep_valid_rows"],
    )
    if result.stored:
        rows = "row" if result.invalid == 1 else "rows"
        kept = f"; {result.invalid:,} invalid {rows} skipped" if result.invalid else ""
        replaced = (
            f"; v{result.replaced_version}, which it replaces, stays available"
            if result.replaced_version
            else ""
        )
        messages.success(
            request,
            f"Stored {result.valid:,} tasks as task set v{result.replaced_version + 1} "
            f"({result.held_out:,} held out){kept}{replaced}.",
        )
        return redirect("registry:domain_detail", pk=domain.pk)
    context = {"domain": domain, "form": form, "result": result, "file_error": result.file_error}
    return render(request, "registry/domain_upload.html", context, status=422)


@login_required
@require_POST
def domain_resplit(request: HttpRequest, pk: int) -> HttpResponse:
    domain, _ = _domain_for(request, pk, Role.RESEARCHER)
    form = forms.ResplitForm(request.POST)
    if not form.is_valid():
        problems = "; ".join(
            f"{name}: {' '.join(str(error) for error in errors)}"
            for name, errors in form.errors.items()
        )
        messages.error(request, f"Not re-split: {problems}")
        return redirect("registry:domain_detail", pk=domain.pk)
    domain = services.domain_resplit(actor=request.user, domain=domain, **form.cleaned_data)
    messages.success(
        request,
        f"Re-split: {domain.train_count:,} train, {domain.held_out_count:,} held out.",
    )
    return redirect("registry:domain_detail", pk=domain.pk)


EXAMPLE_RUBRIC = """\
version: 1
description: Exact final answer, with a small bonus for the answer format.
criteria:
  - name: correct
    kind: math_equivalence
    weight: 1.0
  - name: format
    kind: regex_match
    weight: 0.1
    params:
      pattern: "\\\\boxed\\\\{.+\\\\}"
aggregate: weighted_sum
"""


def _kinds_context() -> dict[str, Any]:
    kinds = [
        {
            "name": info.name,
            "summary": info.summary,
            "docs": info.docs,
            "uses_sandbox": info.uses_sandbox,
            "params_json": json.dumps(info.params_schema, indent=2, ensure_ascii=False),
        }
        for info in specs.criterion_kinds().values()
    ]
    return {"criterion_kinds": kinds}


# --- versioned objects: the pages every kind shares ---------------------------------------------


@dataclass(frozen=True)
class KindPages:
    """What differs between kinds on the shared pages: names in words and the templates that
    show a version's payload. URL names follow `registry:<key>_<page>` for every kind."""

    kind: services.VersionedKind
    plural: str
    edit_payload_label: str
    summary_template: str
    form_template: str
    # The draft editor: its form, its template, how the form's values become the payload, the
    # payload a first draft starts from, and anything more the page shows.
    draft_form: type[Form]
    draft_template: str
    form_payload: Callable[[Any], dict[str, Any]]
    default_payload: dict[str, Any]
    draft_extras: Callable[[], dict[str, Any]]
    # The create form: the object's name plus its first version's payload.
    create_form: type[Form]
    create_initial: dict[str, Any]

    @property
    def urls(self) -> dict[str, str]:
        pages = ("list", "create", "detail", "edit", "draft", "version", "version_publish")
        return {page: f"registry:{self.kind.key}_{page}" for page in pages}


KIND_PAGES = {
    "rubric": KindPages(
        kind=services.RUBRIC,
        plural="Reward rubrics",
        edit_payload_label="Edit spec",
        summary_template="registry/_rubric_summary.html",
        form_template="registry/rubric_form.html",
        draft_form=forms.RubricSourceForm,
        draft_template="registry/rubric_draft.html",
        form_payload=lambda form: {
            "source": form.cleaned_data["source"],
            "source_format": form.cleaned_data["source_format"],
        },
        default_payload={},
        draft_extras=lambda: _kinds_context(),
        create_form=forms.RubricCreateForm,
        create_initial={"source": EXAMPLE_RUBRIC, "source_format": "yaml"},
    ),
    "sandbox_image": KindPages(
        kind=services.SANDBOX_IMAGE,
        plural="Sandbox images",
        edit_payload_label="Edit image and limits",
        summary_template="registry/_sandbox_image_summary.html",
        form_template="registry/sandbox_image_form.html",
        draft_form=forms.SandboxVersionForm,
        draft_template="registry/sandbox_image_draft.html",
        form_payload=lambda form: form.version_values(),
        default_payload=services.SANDBOX_DEFAULTS,
        draft_extras=dict,
        create_form=forms.SandboxImageCreateForm,
        create_initial=services.SANDBOX_DEFAULTS,
    ),
}


def _pages_context(pages: KindPages) -> dict[str, Any]:
    return {"pages": pages, "kind": pages.kind, "urls": pages.urls}


@login_required
@require_GET
def versioned_list(request: HttpRequest, kind: str) -> HttpResponse:
    pages = KIND_PAGES[kind]
    membership = require_active_membership(request)
    query = _search_query(request)
    objects = selectors.versioned_list(kind=pages.kind, team=membership.team, query=query)
    context = {
        "page": _page(request, objects),
        "q": query,
        "can_edit": _can_edit(membership),
        **_pages_context(pages),
    }
    if request.htmx:  # type: ignore[attr-defined]
        return render(request, "registry/versioned_list.html#results", context)
    return render(request, "registry/versioned_list.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def versioned_create(request: HttpRequest, kind: str) -> HttpResponse:
    """A new object with its draft version 1."""
    pages = KIND_PAGES[kind]
    membership = require_active_membership(request, Role.RESEARCHER)
    form = pages.create_form(request.POST or None, initial=pages.create_initial)
    context = {
        "form": form,
        pages.kind.parent_field: None,
        **pages.draft_extras(),
        **_pages_context(pages),
    }
    if request.method == "POST" and form.is_valid() and not _validating(request):
        try:
            obj = services.versioned_create(
                kind=pages.kind,
                actor=request.user,
                team=membership.team,
                slug=form.cleaned_data["slug"],
                title=form.cleaned_data["title"],
                description=form.cleaned_data["description"],
                payload=pages.form_payload(form),
            )
        except ValidationError as error:
            _apply_service_errors(form, error)
        else:
            label = pages.kind.label.capitalize()
            messages.success(request, f"{label} {obj.slug} created as draft version 1.")
            return redirect(pages.urls["detail"], pk=obj.pk)
    return _form_response(request, pages.form_template, context)


@login_required
@require_GET
def versioned_detail(request: HttpRequest, pk: int, kind: str) -> HttpResponse:
    pages = KIND_PAGES[kind]
    obj, membership = _versioned_for(request, pages.kind, pk)
    versions = obj.versions.all()
    context = {
        "obj": obj,
        "versions": versions,
        # At most one; its publish control sits in the page's head, in reach on a phone.
        "draft": next((version for version in versions if version.is_draft), None),
        "domains": obj.domains.order_by("slug"),
        "can_edit": _can_edit(membership),
        **_pages_context(pages),
    }
    return render(request, "registry/versioned_detail.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def versioned_edit(request: HttpRequest, pk: int, kind: str) -> HttpResponse:
    """Rename or re-describe; the versions are edited on the draft page."""
    pages = KIND_PAGES[kind]
    obj, _ = _versioned_for(request, pages.kind, pk, Role.RESEARCHER)
    initial = {"slug": obj.slug, "title": obj.title, "description": obj.description}
    form = forms.VersionedMetaForm(request.POST or None, initial=initial)
    # The kind's own form template names the object by its kind ("rubric", "image").
    context = {"form": form, pages.kind.parent_field: obj, "meta_only": True}
    if request.method == "POST" and form.is_valid() and not _validating(request):
        try:
            services.versioned_update(
                kind=pages.kind, actor=request.user, obj=obj, **form.cleaned_data
            )
        except ValidationError as error:
            _apply_service_errors(form, error)
        else:
            messages.success(request, f"{pages.kind.label.capitalize()} saved.")
            return redirect(pages.urls["detail"], pk=obj.pk)
    return _form_response(request, pages.form_template, context)


@login_required
@require_http_methods(["GET", "POST"])
def versioned_draft(request: HttpRequest, pk: int, kind: str) -> HttpResponse:
    """The draft editor: edits the draft, or starts a new draft from the latest version. Every
    kind checks while editing the same way (the errors swapped in by id) and saves through the
    same service."""
    pages = KIND_PAGES[kind]
    obj, _ = _versioned_for(request, pages.kind, pk, Role.RESEARCHER)
    base = selectors.versioned_draft(kind=pages.kind, obj=obj) or selectors.versioned_latest(
        kind=pages.kind, obj=obj
    )
    initial = pages.kind.stored_payload(base) if base is not None else pages.default_payload
    form = pages.draft_form(request.POST or None, initial=initial)
    context = {
        "form": form,
        pages.kind.parent_field: obj,
        "base": base,
        "draft": base if base is not None and base.is_draft else None,
        **pages.draft_extras(),
        **_pages_context(pages),
    }
    if request.method == "POST" and form.is_valid() and not _validating(request):
        try:
            version = services.versioned_save_draft(
                kind=pages.kind, actor=request.user, obj=obj, payload=pages.form_payload(form)
            )
        except ValidationError as error:
            _apply_service_errors(form, error)
        else:
            messages.success(request, f"Draft version {version.number} saved.")
            return redirect(pages.urls["version"], pk=obj.pk, number=version.number)
    return _form_response(request, pages.draft_template, context)


@login_required
@require_POST
def versioned_version_publish(
    request: HttpRequest, pk: int, number: int, kind: str
) -> HttpResponse:
    """Publish a draft (the page asks for confirmation first). Back to the page the button was
    on: the object's page or the version's."""
    pages = KIND_PAGES[kind]
    version, _ = _version_for(request, pages.kind, pk, number, Role.RESEARCHER)
    back = (
        redirect(pages.urls["detail"], pk=pk)
        if request.POST.get("back") == "detail"
        else redirect(pages.urls["version"], pk=pk, number=number)
    )
    try:
        services.versioned_publish(kind=pages.kind, actor=request.user, version=version)
    except services.VersionConflict as conflict:
        messages.error(request, f"Not published: {conflict}.")
    except ValidationError as error:
        messages.error(request, "Not published: " + "; ".join(error.messages))
    else:
        messages.success(request, f"Version {number} published; it can no longer change.")
    return back


# --- rubrics ------------------------------------------------------------------------------------


@login_required
@require_GET
def rubric_version(request: HttpRequest, pk: int, number: int) -> HttpResponse:
    version, membership = _rubric_version_for(request, pk, number)
    context = {
        "rubric": version.rubric,
        "obj": version.rubric,
        "version": version,
        **_pages_context(KIND_PAGES["rubric"]),
        "changes": selectors.rubric_version_changes(version=version),
        "can_edit": _can_edit(membership),
        "try_form": forms.TrySampleForm(),
    }
    return render(request, "registry/rubric_version.html", context)


@login_required
@require_POST
def rubric_version_try(request: HttpRequest, pk: int, number: int) -> HttpResponse:
    """Score a hand-written sample with this version (nothing is stored), in a child process
    (console.registry.scoring), never in the web process. Researchers only: criteria may start
    sandboxes."""
    version, membership = _rubric_version_for(request, pk, number, Role.RESEARCHER)
    form = forms.TrySampleForm(request.POST)
    context: dict[str, Any] = {
        "rubric": version.rubric,
        "version": version,
        "try_form": form,
        "can_edit": _can_edit(membership),
    }
    if form.is_valid():
        # Checked again: the version may predate today's TRUSTED_REWARD_FUNCTIONS.
        _, issues = specs.check_rubric_source(version.source, version.source_format)
        if issues:
            context["try_error"] = "Not scored: " + "; ".join(str(issue) for issue in issues)
        else:
            try:
                context["result"] = scoring.score_sample(
                    version.spec, domain=version.rubric.slug, **form.cleaned_data
                )
            except scoring.ScoringFailed as failure:
                context["try_error"] = str(failure)
    if request.htmx:  # type: ignore[attr-defined]
        return render(request, "registry/rubric_version.html#try", context)
    return render(request, "registry/rubric_version.html", context)


# --- sandbox images -----------------------------------------------------------------------------


@login_required
@require_GET
def sandbox_image_version(request: HttpRequest, pk: int, number: int) -> HttpResponse:
    version, membership = _version_for(request, services.SANDBOX_IMAGE, pk, number)
    context = {
        "image": version.image,
        "obj": version.image,
        "version": version,
        "can_edit": _can_edit(membership),
        **_pages_context(KIND_PAGES["sandbox_image"]),
    }
    return render(request, "registry/sandbox_image_version.html", context)
