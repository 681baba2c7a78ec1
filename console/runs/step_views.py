"""A run's steps: the step picker with the slowest steps (a page, and a card the run page loads
with htmx), and one step's timeline as a Gantt chart per host and rank (`console.runs.steps`).

Access as for the run page (`views._run_for`: every member reads, outsiders get 404).
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET

from console.runs import steps
from console.runs.views import _run_for

MAX_STEP = 2**31 - 1


@login_required
@require_GET
def step_list(request: HttpRequest, pk: int) -> HttpResponse:
    """The step picker and the slowest steps; ``?step=N`` opens step N's timeline."""
    run, _ = _run_for(request, pk)
    wanted = request.GET.get("step", "").strip()
    error = ""
    if wanted:
        if wanted.isdigit() and int(wanted) <= MAX_STEP:
            return redirect("runs:step_timeline", pk=run.pk, step=int(wanted))
        error = f"Step: “{wanted[:40]}” is not a step number (a whole number from 0)."
    first, last = steps.timeline_steps(run)
    context = {
        "run": run,
        "slowest": steps.slowest_steps(run),
        "first_step": first,
        "last_step": last,
        "step_error": error,
        "wanted": wanted[:40],
    }
    status = 422 if error else 200
    if request.htmx:  # type: ignore[attr-defined]
        return render(request, "runs/steps.html#card", context, status=status)
    return render(request, "runs/steps.html", context, status=status)


@login_required
@require_GET
def step_timeline(request: HttpRequest, pk: int, step: int) -> HttpResponse:
    run, _ = _run_for(request, pk)
    timeline = steps.step_timeline(run, step)
    if timeline is None:
        raise Http404(f"Step {step} has no timeline")
    before, after = steps.neighbours(run, step)
    context = {
        "run": run,
        "timeline": timeline,
        "half_step_s": timeline.step_s / 2,
        "before": before,
        "after": after,
        "stage_order": steps.STAGE_ORDER,
    }
    return render(request, "runs/step_timeline.html", context)
