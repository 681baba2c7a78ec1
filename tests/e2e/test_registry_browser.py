"""A researcher builds a registry in a real browser against the real ASGI server: a sandbox image,
a rubric (validated as they type, then published), a domain with an uploaded task set. Every
registry page is saved as a screenshot under test-artifacts/registry-*.png."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from console.registry.models import Domain, Rubric, SandboxImage, VersionStatus
from tests.e2e.conftest import login, screenshot

INVALID_SPEC = json.dumps(
    {"version": 1, "criteria": [{"name": "correct", "kind": "math_equivalence", "weight": -1}]},
    indent=2,
)
VALID_SPEC = json.dumps(
    {"version": 1, "criteria": [{"name": "correct", "kind": "math_equivalence", "weight": 1}]},
    indent=2,
)
EVIL = "<script>window.__pwned = true</script><img src=x onerror='window.__pwned = true'>"


def _tasks_file(tmp_path: Path) -> Path:
    path = tmp_path / "arith.jsonl"
    rows = [{"prompt": f"What is {n} + {n}?", "ground_truth": str(2 * n)} for n in range(40)]
    rows.append({"prompt": EVIL, "ground_truth": "0", "metadata": {"note": EVIL}})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _bad_file(tmp_path: Path) -> Path:
    path = tmp_path / "broken.jsonl"
    path.write_bytes(b'{"prompt": "ok", "ground_truth": 1}\n{"prompt": "no answer"}\n{oops\n')
    return path


def test_a_researcher_registers_an_image_a_rubric_and_a_domain(
    page: Any, people: Any, live_server_url: str, tmp_path: Path
) -> None:
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    login(page, people.owner)

    page.goto("/")
    page.get_by_role("heading", name="Registry of Lab").wait_for()
    screenshot(page, "registry-home")

    # --- a sandbox image: a bad limit is flagged inline before submitting ---
    page.goto("/sandbox-images/new/")
    page.get_by_label("Slug").fill("python-bwrap")
    page.get_by_label("Title").fill("Python in bubblewrap")
    page.get_by_label("Memory (MB)").fill("0")
    page.get_by_label("Processes").focus()  # leaving the field fires "change": htmx validates
    page.get_by_text("Ensure this value is greater than or equal to 16.").wait_for()
    screenshot(page, "registry-sandbox-image-form-invalid")
    page.get_by_label("Memory (MB)").fill("512")
    page.get_by_role("button", name="Create sandbox image (draft v1)").click()
    page.get_by_role("heading", name="Python in bubblewrap").wait_for()
    screenshot(page, "registry-sandbox-image-detail")
    page.get_by_role("link", name="v1").click()
    # Publishing asks first (it cannot be undone), in the page rather than a dialog.
    page.get_by_text("Publish v1…").click()
    page.get_by_text("freezes python-bwrap v1 for good").wait_for()
    screenshot(page, "registry-sandbox-image-publish-confirm")
    page.get_by_role("button", name="Yes, publish v1").click()
    page.locator(".messages li", has_text="Version 1 published").wait_for()
    screenshot(page, "registry-sandbox-image-version")
    page.get_by_role("link", name="Edit as a new draft").click()
    page.get_by_text("saving creates a new draft version").wait_for()
    screenshot(page, "registry-sandbox-image-draft")
    page.goto("/sandbox-images/")
    screenshot(page, "registry-sandbox-image-list")

    # --- a rubric: each error shows at its path, then it is created and published ---
    page.goto("/rubrics/new/")
    page.get_by_label("Slug").fill("arith")
    page.get_by_label("Title").fill("Arithmetic")
    page.get_by_label("Spec").fill(INVALID_SPEC)
    page.get_by_label("Title").focus()
    issue = page.locator("#spec-issues code.path", has_text="criteria[0].weight")
    issue.wait_for()
    assert "must be a number ≥ 0" in page.locator("#spec-issues").inner_text()
    screenshot(page, "registry-rubric-form-invalid")
    page.get_by_label("Spec").fill(VALID_SPEC)
    page.get_by_role("button", name="Create rubric (draft v1)").click()
    page.get_by_role("heading", name="Versions").wait_for()
    screenshot(page, "registry-rubric-detail")
    # Published from the rubric's own page, which it returns to.
    page.get_by_text("Publish v1…").click()
    page.get_by_role("button", name="Yes, publish v1").click()
    page.locator(".messages li", has_text="Version 1 published").wait_for()
    page.get_by_role("link", name="v1").click()
    page.locator("#version-status", has_text="Published").wait_for()
    # Try the published version on a sample: scored in place (htmx), nothing stored.
    page.get_by_label("Completion").fill("So the answer is \\boxed{12}")
    page.get_by_label("Ground truth").fill("12")
    page.get_by_role("button", name="Score").click()
    page.locator("#try-total", has_text="1.0").wait_for()
    screenshot(page, "registry-rubric-version")
    # Editing the published version: the editor validates while typing, and says it will
    # make a new draft.
    page.get_by_role("link", name="Edit as a new draft").click()
    page.get_by_text("saving creates a new draft version").wait_for()
    page.get_by_label("Spec").fill(INVALID_SPEC)
    page.locator("#spec-issues code.path", has_text="criteria[0].weight").wait_for()
    screenshot(page, "registry-rubric-draft-editor")
    # A valid spec that turns invalid while typing is never shown as valid: the verdict goes
    # stale at the keystroke, and the new check reports the problem.
    page.get_by_label("Spec").fill(VALID_SPEC)
    page.get_by_text("The spec is valid.").wait_for()
    page.get_by_label("Spec").press("End")
    page.keyboard.type(",")
    assert "valid" not in page.locator("#spec-issues").inner_text()
    page.locator("#spec-issues .issues").wait_for()
    assert "The spec is valid." not in page.locator("#spec-issues").inner_text()
    screenshot(page, "registry-rubric-draft-editor-typing")
    page.goto("/rubrics/")
    screenshot(page, "registry-rubric-list")

    # --- a domain using both, with an uploaded task set ---
    page.goto("/domains/new/")
    page.get_by_label("Slug").fill("arithmetic")
    page.get_by_label("Title").fill("Arithmetic")
    page.get_by_label("Default mix weight").fill("2")
    page.get_by_label("Rubric").select_option(label="arith")
    page.get_by_label("Sandbox image").select_option(label="python-bwrap")
    screenshot(page, "registry-domain-form")
    page.get_by_role("button", name="Create domain").click()
    page.get_by_role("heading", name="Upload a task set").wait_for()
    # A broken file is reported row by row, and nothing is stored.
    page.get_by_label("File").set_input_files(str(_bad_file(tmp_path)))
    page.get_by_role("button", name="Upload").click()
    page.get_by_role("heading", name="Nothing was stored").wait_for()
    report = page.locator("#upload-report").inner_text()
    assert "missing required field 'ground_truth'" in report and "broken JSON" in report
    screenshot(page, "registry-domain-upload-errors")
    page.get_by_role("link", name="arithmetic").click()
    page.get_by_label("File").set_input_files(str(_tasks_file(tmp_path)))
    page.get_by_label("Held out fraction").fill("0.25")
    page.get_by_role("button", name="Upload").click()
    page.locator(".messages li", has_text="Stored 41 tasks").wait_for()
    assert page.locator("#task-count").inner_text() == "41"
    # The prompt with a script shows as text and runs nothing.
    page.goto(page.url + "?page=3")
    page.get_by_text("<script>window.__pwned = true</script>", exact=False).first.wait_for()
    assert page.evaluate("window.__pwned === undefined")
    screenshot(page, "registry-domain-detail")
    page.get_by_role("link", name="Edit").click()
    page.get_by_label("Title").fill("Arithmetic drills")
    screenshot(page, "registry-domain-edit")
    page.get_by_role("button", name="Save").click()
    page.locator(".messages li", has_text="Domain saved.").wait_for()

    # --- search narrows the list in place (htmx), with the URL kept in step ---
    page.goto("/domains/")
    page.get_by_role("searchbox", name="Search").fill("drills")
    page.wait_for_url(lambda url: url.endswith("/domains/?q=drills"))
    assert "arithmetic" in page.locator("#results").inner_text()
    page.get_by_role("searchbox", name="Search").fill("nothing-like-this")
    page.get_by_text("No domain matches").wait_for()
    page.get_by_role("searchbox", name="Search").fill("")
    page.locator("#results", has_text="arithmetic").wait_for()
    screenshot(page, "registry-domain-list")

    assert dialogs == []
    domain = Domain.objects.get(team=people.team, slug="arithmetic")
    assert domain.task_count == 41 and domain.title == "Arithmetic drills"
    assert domain.rubric == Rubric.objects.get(team=people.team, slug="arith")
    assert domain.sandbox_image == SandboxImage.objects.get(team=people.team, slug="python-bwrap")
    versions = dict(domain.rubric.versions.values_list("number", "status"))
    assert versions == {1: VersionStatus.PUBLISHED}  # the invalid edit saved nothing


def test_an_annotator_reads_the_registry_without_edit_controls(
    page: Any, people: Any, live_server_url: str
) -> None:
    from console.registry import services

    services.domain_create(actor=people.owner, team=people.team, slug="math", title="Math")
    login(page, people.teammate_annotator)
    page.goto("/domains/")
    page.get_by_role("link", name="math").click()
    page.get_by_role("heading", name="Tasks").wait_for()
    assert page.get_by_role("link", name="Edit").count() == 0
    assert page.get_by_text("Upload a task set").count() == 0
    screenshot(page, "registry-domain-detail-annotator")
