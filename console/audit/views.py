from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from console.accounts.access import require_active_membership
from console.audit.forms import AuditFilterForm
from console.audit.selectors import audit_entries, audit_filter_choices

PAGE_SIZE = 50


@login_required
def entry_list(request: HttpRequest) -> HttpResponse:
    """The active team's audit log, filtered and paged; htmx requests get only the table."""
    membership = require_active_membership(request)
    form = AuditFilterForm(request.GET, choices=audit_filter_choices(team=membership.team))
    form.is_valid()
    entries = audit_entries(team=membership.team, filters=form.filters())
    page = Paginator(entries, PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {"form": form, "page": page, "query": query.urlencode()}
    template = "audit/entry_list.html"
    if getattr(request, "htmx", False) and not request.htmx.boosted:  # type: ignore[attr-defined]
        template += "#entries"
    return render(request, template, context)
