"""Every page a person lives in, at desktop and phone width: the same navigation everywhere,
no page wider than the screen, a header that stays two short lines on a phone, and an audit log
that shows changes rather than whole objects. Screenshots: test-artifacts/page-<name>-<width>.png.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from django.utils import timezone

from console.registry import services
from console.registry.demo import seed_demo_domain
from console.runs import services as run_services
from console.runs.launch import default_document
from console.runs.models import Host
from tests.console.factories import attempt_create
from tests.console.test_registry_factories import build_registry, jsonl, task_rows
from tests.e2e.conftest import login, screenshot
from training.demo.domains import get_domain

WIDTHS = {"desktop": {"width": 1280, "height": 900}, "phone": {"width": 390, "height": 844}}
SECTIONS = [
    "Registry",
    "Domains",
    "Rubrics",
    "Sandbox images",
    "Runs",
    "Models",
    "Hosts",
    "Scheduler",
    "Audit log",
    "Status",
    "Members",
    "API tokens",
    "API",
]
# The header on a phone: brand and who-am-I on one line, the navigation on the next.
PHONE_HEADER_MAX_PX = 110
# 30-odd audit entries used to make an 18,000 px page.
AUDIT_PAGE_MAX_PX = 4_000


def _pages(people: Any) -> dict[str, str]:
    registry = build_registry(people)
    services.domain_upload_tasks(
        actor=people.owner,
        domain=registry.domain,
        stream=io.BytesIO(jsonl(task_rows(12, start=50))),
        filename="second.jsonl",
        held_out_fraction=0.25,
        split_seed=1,
    )
    for n in range(12):  # enough history for the audit log to be long
        services.rubric_update(
            actor=people.owner,
            rubric=registry.rubric,
            slug=registry.rubric.slug,
            title=f"Math rubric, take {n}",
            description="Exact final answer.",
        )
    domain, rubric, image = registry.domain.pk, registry.rubric.pk, registry.image.pk
    return {
        "registry-home": "/",
        "domain-list": "/domains/",
        "domain-detail": f"/domains/{domain}/",
        "domain-older-taskset": f"/domains/{domain}/?taskset=1",
        "domain-upload": f"/domains/{domain}/upload/",
        "rubric-list": "/rubrics/",
        "rubric-detail": f"/rubrics/{rubric}/",
        "rubric-version": f"/rubrics/{rubric}/versions/2/",
        "rubric-draft": f"/rubrics/{rubric}/draft/",
        "sandbox-image-list": "/sandbox-images/",
        "sandbox-image-detail": f"/sandbox-images/{image}/",
        "sandbox-image-version": f"/sandbox-images/{image}/versions/1/",
        "sandbox-image-draft": f"/sandbox-images/{image}/draft/",
        "audit-log": "/audit/",
        "status": "/status/",
        "tokens": "/accounts/tokens/",
        "members": "/accounts/members/",
    }


def _run_pages(people: Any, tmp_path: Path) -> dict[str, str]:
    """A model, a launchable domain, a queued run with one attempt on a host."""
    model_dir = tmp_path / "models" / "base"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text(json.dumps({"model_type": "demo"}))
    model = run_services.model_register(
        actor=people.owner, team=people.team, slug="base", title="Base model", path=str(model_dir)
    )
    seed_demo_domain(team=people.team, user=people.owner, demo=get_domain("parity"), image=None)
    document = default_document(model="base", domains=[("parity", 1.0)])
    document["name"] = "parity-grpo"
    run = run_services.run_launch(actor=people.owner, team=people.team, document=document)
    host = Host.objects.create(
        name="gpu-host-a",
        gpu_slots=1,
        inventory={"gpus": [{"index": 0, "name": "NVIDIA H200", "memory_mb": 143_771}]},
        heartbeat_at=timezone.now(),
    )
    log = "step 1: reward/mean 0.25\n"
    attempt_create(run, host, log_head=log, log_bytes=len(log))
    return {
        "run-list": "/runs/",
        "run-new": "/runs/new/",
        "run-detail": f"/runs/{run.pk}/",
        "model-list": "/models/",
        "model-version": f"/models/{model.model_id}/versions/{model.number}/",
        "host-list": "/hosts/",
    }


def _check_page(page: Any, name: str, url: str, width_name: str, problems: list[str]) -> None:
    page.goto(url)
    page.locator("nav.mainnav").wait_for()
    nav = [text.strip() for text in page.locator("nav.mainnav a").all_inner_texts()]
    if nav != SECTIONS:
        problems.append(f"{name} {width_name}: navigation {nav}")
    overflow = page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    if overflow > 1:
        problems.append(f"{name} {width_name}: {overflow} px wider than the screen")
    header = page.locator("header.topbar").bounding_box()
    if width_name == "phone" and header["height"] > PHONE_HEADER_MAX_PX:
        problems.append(f"{name} phone: header {header['height']} px tall")
    if name == "audit-log":
        height = page.evaluate("document.documentElement.scrollHeight")
        if height > AUDIT_PAGE_MAX_PX:
            problems.append(f"audit log {width_name}: {height} px tall")
    screenshot(page, f"page-{name}-{width_name}")


def _check_pages_and_a_confirmation(
    page: Any, pages: dict[str, str], confirm: tuple[str, str, str, str]
) -> None:
    """Every page at each width, then one confirmation that opens in the page, on screen:
    ``confirm`` is (page name, link text, confirming button's name, screenshot name)."""
    name, opener, button, shot = confirm
    problems: list[str] = []
    for width_name, viewport in WIDTHS.items():
        page.set_viewport_size(viewport)
        for page_name, url in pages.items():
            _check_page(page, page_name, url, width_name, problems)
        page.goto(pages[name])
        page.get_by_text(opener).click()
        page.get_by_role("button", name=button).wait_for()
        overflow = page.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        if overflow > 1:
            problems.append(f"{shot} confirmation {width_name}: {overflow} px too wide")
        screenshot(page, f"page-{shot}-{width_name}")
    assert not problems, "\n".join(problems)


def test_every_page_at_desktop_and_phone_width(
    page: Any, people: Any, live_server_url: str
) -> None:
    pages = _pages(people)
    login(page, people.teammate_admin)
    # Publishing from the object's page asks first.
    publish = ("rubric-detail", "Publish v2…", "Yes, publish v2", "rubric-detail-publish")
    _check_pages_and_a_confirmation(page, pages, publish)


def test_the_runs_pages_at_desktop_and_phone_width(
    page: Any, people: Any, live_server_url: str, tmp_path: Path
) -> None:
    """Apart from the registry's pages, so the audit log's length above is the registry's."""
    pages = _run_pages(people, tmp_path)
    login(page, people.teammate_admin)
    cancel = ("run-detail", "Cancel…", "Yes, cancel the run", "run-detail-cancel")
    _check_pages_and_a_confirmation(page, pages, cancel)


def test_an_audit_entry_opens_to_the_fields_it_changed(
    page: Any, people: Any, live_server_url: str
) -> None:
    _pages(people)
    login(page, people.owner)
    page.goto("/audit/?action=rubric.update")
    first = page.locator("table.audit > tbody > tr").first
    first.get_by_text("2 fields").click()
    diff = first.locator("table.diff")
    diff.wait_for()
    assert "Math rubric, take 10" in diff.inner_text()
    assert "Math rubric, take 11" in diff.inner_text()
    screenshot(page, "page-audit-log-entry-open")
