from __future__ import annotations

from asgiref.sync import sync_to_async
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from console.status.probes import collect_status


async def status_page(request: HttpRequest) -> HttpResponse:
    """Every part's state, probed now; the page then stays live over /ws/status/.
    htmx requests (the Refresh button) get only the table."""
    user = await request.auser()
    if not user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    snapshot = await collect_status()
    template = "status/page.html"
    if getattr(request, "htmx", False):
        template += "#components"
    return await sync_to_async(render)(request, template, {"snapshot": snapshot})
