"""Runs pages: the role matrix for every page and every POST (owner, teammates of each role,
outsider, anonymous), the new-run form (path-keyed errors, nothing saved on a bad submission,
a queued run on a good one), run commands, promotion, models and hosts. Real PostgreSQL;
objects built with the services (launching needs no worker: the placement message goes out
after commit, and a broker failure is caught)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from console.registry.demo import seed_demo_domain
from console.registry.models import Domain
from console.runs import services
from console.runs.launch import default_document
from console.runs.models import (
    Allocation,
    Attempt,
    AttemptState,
    Checkpoint,
    Host,
    MetricRow,
    ModelVersion,
    Run,
    RunCommand,
    RunState,
)
from tests.console.factories import (
    ANONYMOUS,
    EVERYONE,
    OUTSIDER,
    READERS,
    TEAMMATE_ANNOTATOR,
    WRITERS,
    attempt_create,
)
from tests.console.test_registry_factories import make_domain, make_rubric
from training.demo.domains import get_domain

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


def model_dir(path: Path) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "demo"}))
    return str(path)


@dataclass
class Lab:
    people: Any
    model: ModelVersion
    parity: Domain
    blocked: Domain
    run: Run
    checkpoint: Checkpoint
    tmp_path: Path


def launch(people: Any, name: str = "parity-run", **changes: Any) -> Run:
    document = default_document(model="base", domains=[("parity", 1.0)])
    document.update(name=name, max_steps=4, **changes)
    return services.run_launch(actor=people.owner, team=people.team, document=document)


@pytest.fixture
def lab(people: Any, tmp_path: Path, settings: Any) -> Lab:
    settings.RUNS_ROOT = tmp_path / "runs"
    model = services.model_register(
        actor=people.owner,
        team=people.team,
        slug="base",
        title="Base model",
        path=model_dir(tmp_path / "base"),
    )
    parity = seed_demo_domain(
        team=people.team, user=people.owner, demo=get_domain("parity"), image=None
    )
    rubric = make_rubric(team=people.team, user=people.owner, slug="draft-rubric")
    blocked = make_domain(team=people.team, user=people.owner, slug="blocked", rubric=rubric)
    run = launch(people)
    host = Host.objects.create(name="gpu-a", gpu_slots=1, heartbeat_at=timezone.now())
    attempt = attempt_create(
        run,
        host,
        state=AttemptState.FAILED,
        exit_code=1,
        error="boom",
        log_head="step 1 ok\n",
        log_bytes=10,
    )
    checkpoint = Checkpoint.objects.create(
        run=run,
        attempt=attempt,
        step=2,
        path=str(Path(model_dir(tmp_path / "runs" / "ckpt-2" / "hf")).parent),  # as saved
        reason="periodic",
    )
    MetricRow.objects.create(
        run=run, step=2, values={"reward/mean": 0.625, "eval/reward/mean": 0.5, "pass_rate": 0.5}
    )
    return Lab(people, model, parity, blocked, run, checkpoint, tmp_path)


def is_login_redirect(response: Any) -> bool:
    return response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def expect(response: Any, who: str, allowed: frozenset, ok: int = 200) -> bool:
    """Checks the role matrix's answer; True when `who` was allowed."""
    if who == ANONYMOUS:
        assert is_login_redirect(response), f"{who}: {response.status_code}"
    elif who == OUTSIDER:
        assert response.status_code == 404, f"{who}: {response.status_code}"
    elif who not in allowed:
        assert response.status_code == 403, f"{who}: {response.status_code}"
    else:
        assert response.status_code == ok, f"{who}: {response.status_code}"
        return True
    return False


# --- the role matrix: pages -----------------------------------------------------------------

OBJECT_PAGES: dict[str, Callable[[Lab], str]] = {
    "run_detail": lambda lab: reverse("runs:run_detail", args=[lab.run.pk]),
    "run_detail_live": lambda lab: reverse("runs:run_detail", args=[lab.run.pk]) + "?part=live",
    "model_version": lambda lab: reverse("runs:model_version", args=[lab.model.model_id, 1]),
    "export_trajectories": lambda lab: reverse("runs:run_export_trajectories", args=[lab.run.pk]),
    "export_metrics": lambda lab: reverse("runs:run_export_metrics", args=[lab.run.pk]),
    "export_parquet": lambda lab: reverse("runs:run_export_parquet", args=[lab.run.pk]),
}


@pytest.mark.parametrize("page", OBJECT_PAGES)
def test_run_and_model_pages_are_shown_to_team_members_only(
    page: str, client_as: Callable[[str], Client], lab: Lab
) -> None:
    for who in EVERYONE:
        response = client_as(who).get(OBJECT_PAGES[page](lab), **HTMX)
        expect(response, who, READERS)


def test_list_pages_show_the_team_objects_to_members_and_nothing_to_others(
    client_as: Callable[[str], Client], lab: Lab
) -> None:
    for who in EVERYONE:
        for name, marker in (("runs:run_list", "parity-run"), ("runs:model_list", "Base model")):
            response = client_as(who).get(reverse(name))
            if who == ANONYMOUS:
                assert is_login_redirect(response)
                continue
            assert response.status_code == 200, (who, name)
            content = response.content.decode()
            assert (marker in content) == (who in READERS), (who, name)
            if name == "runs:run_list":
                # The button only for those who may launch (the outsider, in their own team).
                assert ("New run" in content) == (who in WRITERS or who == OUTSIDER), who


def test_hosts_are_shown_to_every_member_and_other_teams_runs_stay_anonymous(
    client_as: Callable[[str], Client], lab: Lab
) -> None:
    host = Host.objects.get(name="gpu-a")
    attempt = Attempt.objects.create(run=lab.run, number=2, host=host)
    Allocation.objects.create(attempt=attempt, run=lab.run, host=host, node_rank=0, gpus=1)
    for who in EVERYONE:
        response = client_as(who).get(reverse("runs:host_list"))
        if who == ANONYMOUS:
            assert is_login_redirect(response)
            continue
        content = response.content.decode()
        assert response.status_code == 200 and "gpu-a" in content, who
        assert ("parity-run" in content) == (who in READERS), who
        assert ("a run of another team" in content) == (who == OUTSIDER), who


def test_the_new_run_form_is_for_researchers_and_admins(
    client_as: Callable[[str], Client], lab: Lab
) -> None:
    for who in EVERYONE:
        response = client_as(who).get(reverse("runs:run_create"))
        if who == ANONYMOUS:
            assert is_login_redirect(response)
        elif who == TEAMMATE_ANNOTATOR:
            assert response.status_code == 403
        else:  # the outsider gets their own team's form
            assert response.status_code == 200, who
            assert ("parity" in response.content.decode()) == (who != OUTSIDER)


# --- the role matrix: writes ----------------------------------------------------------------


@pytest.mark.parametrize("who", EVERYONE)
def test_cancel_is_for_the_team_researchers(
    who: str, client_as: Callable[[str], Client], lab: Lab
) -> None:
    response = client_as(who).post(reverse("runs:run_cancel", args=[lab.run.pk]), {"reason": "x"})
    allowed = expect(response, who, WRITERS, ok=302)
    lab.run.refresh_from_db()
    assert (lab.run.state == RunState.CANCELLED) == allowed


@pytest.mark.parametrize("who", EVERYONE)
def test_preempt_is_for_the_team_researchers(
    who: str, client_as: Callable[[str], Client], lab: Lab
) -> None:
    Run.objects.filter(pk=lab.run.pk).update(state=RunState.RUNNING)
    response = client_as(who).post(reverse("runs:run_preempt", args=[lab.run.pk]))
    allowed = expect(response, who, WRITERS, ok=302)
    lab.run.refresh_from_db()
    assert (lab.run.state == RunState.PREEMPTING) == allowed
    assert RunCommand.objects.filter(run=lab.run, kind="preempt").exists() == allowed


@pytest.mark.parametrize("who", EVERYONE)
def test_overrides_are_for_the_team_researchers(
    who: str, client_as: Callable[[str], Client], lab: Lab
) -> None:
    response = client_as(who).post(
        reverse("runs:run_overrides", args=[lab.run.pk]),
        {"kl_coef": "0.05", "weight_parity": "2", "temperature": ""},
    )
    allowed = expect(response, who, WRITERS, ok=302)
    command = RunCommand.objects.filter(run=lab.run, kind="overrides").first()
    assert (command is not None) == allowed
    if command is not None:
        assert command.payload == {"domain_weights": {"parity": 2.0}, "kl_coef": 0.05}


@pytest.mark.parametrize("who", EVERYONE)
def test_promoting_a_checkpoint_is_for_the_team_researchers(
    who: str, client_as: Callable[[str], Client], lab: Lab
) -> None:
    url = reverse("runs:checkpoint_promote", args=[lab.run.pk, lab.checkpoint.pk])
    response = client_as(who).post(url, {"slug": "parity-tuned", "title": "Tuned"})
    allowed = expect(response, who, WRITERS, ok=302)
    promoted = ModelVersion.objects.filter(source_checkpoint=lab.checkpoint).first()
    assert (promoted is not None) == allowed
    if promoted is not None:
        # The version is the checkpoint's Hugging Face copy: what a run can start from.
        assert Path(promoted.path) == Path(lab.checkpoint.path) / "hf"
        assert response["Location"] == reverse(
            "runs:model_version", args=[promoted.model_id, promoted.number]
        )


@pytest.mark.parametrize("who", EVERYONE)
def test_launching_is_for_researchers_and_admins_of_the_team(
    who: str, client_as: Callable[[str], Client], lab: Lab
) -> None:
    response = client_as(who).post(reverse("runs:run_create"), form_data(lab, name="by-" + who))
    created = Run.objects.filter(team=lab.people.team, name="by-" + who).exists()
    if who == ANONYMOUS:
        assert is_login_redirect(response)
    elif who == TEAMMATE_ANNOTATOR:
        assert response.status_code == 403
    elif who == OUTSIDER:  # in their own team, which has no such model or domain
        assert response.status_code == 422
        assert not Run.objects.filter(name="by-" + who).exists()
    else:
        assert response.status_code == 302, response.content.decode()[:2000]
    assert created == (who in WRITERS)


def test_a_promotion_with_a_bad_slug_is_a_message_not_an_error(
    owner_client: Client, lab: Lab
) -> None:
    url = reverse("runs:checkpoint_promote", args=[lab.run.pk, lab.checkpoint.pk])
    response = owner_client.post(url, {"slug": "Not a slug!"}, follow=True)
    assert response.status_code == 200
    assert "Not promoted" in response.content.decode()
    assert not ModelVersion.objects.filter(source_checkpoint=lab.checkpoint).exists()


def test_a_checkpoint_of_another_run_is_not_found(owner_client: Client, lab: Lab) -> None:
    other = launch(lab.people, name="other-run")
    url = reverse("runs:checkpoint_promote", args=[other.pk, lab.checkpoint.pk])
    assert owner_client.post(url, {"slug": "x"}).status_code == 404


# --- the new-run form -----------------------------------------------------------------------


def form_data(lab: Lab, **changes: Any) -> dict[str, Any]:
    data = {
        "name": "new-run",
        "base_model": "base@1",
        "algorithm": "grpo",
        "max_steps": "4",
        "prompts_per_step": "4",
        "group_size": "4",
        "lr": "0.0003",
        "kl_coef": "0",
        "kl_estimator": "",
        "temperature": "1.0",
        "max_new_tokens": "16",
        "eval_every": "0",
        "checkpoint_every": "2",
        "ewc_strength": "0",
        "gpus": "0",
        "advanced": "",
        f"use_{lab.parity.pk}": "on",
        f"weight_{lab.parity.pk}": "1.0",
    }
    data.update(changes)
    return {key: value for key, value in data.items() if value is not None}


def test_the_form_starts_from_the_default_document(owner_client: Client, lab: Lab) -> None:
    content = owner_client.get(reverse("runs:run_create")).content.decode()
    defaults = default_document(model="base@1", domains=[])
    assert 'value="base@1" selected' in content
    assert f'name="max_steps" value="{defaults["max_steps"]}"' in content
    assert f'name="use_{lab.parity.pk}" id="id_use_{lab.parity.pk}" checked' in content
    # The domain that cannot run yet is shown disabled with the reason.
    row = content[content.index('id="domain-blocked"') :]
    row = row[: row.index("</tr>")]
    assert "disabled" in row and "has no published version yet" in row


def test_a_valid_submission_queues_a_run_and_shows_it(owner_client: Client, lab: Lab) -> None:
    advanced = "sampling:\n  temperature: 0.7\nseed: 3\n"
    response = owner_client.post(
        reverse("runs:run_create"), form_data(lab, kl_estimator="k3", advanced=advanced)
    )
    run = Run.objects.get(name="new-run")
    assert response.status_code == 302
    assert response["Location"] == reverse("runs:run_detail", args=[run.pk])
    assert run.state == RunState.QUEUED and run.max_steps == 4
    assert run.request["batch"]["prompts_per_step"] == 4
    assert run.request["kl"] == {"coef": 0.0, "reference": False, "estimator": "k3"}
    assert run.request["sampling"]["temperature"] == 0.7  # the advanced box wins
    assert run.request["seed"] == 3
    assert run.request["domains"] == [{"domain": "parity", "weight": 1.0}]
    assert run.spec["checkpoint"]["every_steps"] == 2
    page = owner_client.get(response["Location"]).content.decode()
    assert "new-run" in page and "Queued" in page and 'hx-trigger="every 3s"' in page


@pytest.mark.parametrize(
    ("changes", "path", "field"),
    [
        ({"weight_parity": "-1"}, "domains[0].weight: must be &gt;= 0", "weight_parity"),
        ({"use_parity": None}, "domains: required", None),
        ({"use_parity": None, "use_blocked": "on"}, "domains[0].domain: ", "use_blocked"),
        ({"advanced": "kl: {coef: [unclosed"}, "not valid JSON or YAML", "advanced"),
        ({"advanced": "- just\n- a list\n"}, "must be an object", "advanced"),
        ({"advanced": "domains: [{domain: parity, weight: 1}, {domain: blocked}]"}, None, None),
        ({"name": "bad name!"}, "name: required", "name"),
        ({"ewc_strength": "1"}, "ewc: strength &gt; 0 needs fisher_path", "ewc_strength"),
    ],
)
def test_an_invalid_submission_saves_nothing_and_shows_each_error_at_its_path(
    changes: dict[str, Any], path: str | None, field: str | None, owner_client: Client, lab: Lab
) -> None:
    pks = {"parity": lab.parity.pk, "blocked": lab.blocked.pk}
    named = {}
    for key, value in changes.items():
        for slug, pk in pks.items():
            key = key.replace(f"_{slug}", f"_{pk}")
        named[key] = value
    runs_before = Run.objects.count()
    response = owner_client.post(reverse("runs:run_create"), form_data(lab, **named))
    content = response.content.decode()
    assert response.status_code == 422
    assert Run.objects.count() == runs_before
    assert "Not launched; nothing was saved." in content
    if path is None:  # a domain the advanced box names that cannot run
        path = "domains[1].domain: domain &#x27;blocked&#x27; cannot run yet"
    assert path in content
    if field is not None:
        for slug, pk in pks.items():
            field = field.replace(f"_{slug}", f"_{pk}")
        errors = content[content.index(f'id="errors-{field}"') :]
        errors = errors[: errors.index("</ul>")]
        assert "<li>" in errors, f"no error beside {field}"


def test_a_team_without_models_is_told_so(owner_client: Client, people: Any) -> None:
    content = owner_client.get(reverse("runs:run_create")).content.decode()
    assert 'id="no-models"' in content


# --- the run page ---------------------------------------------------------------------------


def test_the_run_page_shows_pins_attempts_metrics_checkpoints_and_logs(
    owner_client: Client, lab: Lab
) -> None:
    Run.objects.filter(pk=lab.run.pk).update(
        state=RunState.FAILED, error="Traceback (most recent call last):\n  <boom>"
    )
    content = owner_client.get(reverse("runs:run_detail", args=[lab.run.pk])).content.decode()
    pin = lab.run.pins["domains"][0]
    assert f"/rubrics/{pin['rubric_id']}/versions/{pin['rubric_version']}/" in content
    assert f"?taskset={pin['taskset_version']}" in content
    assert "gpu-a" in content and "boom" in content
    assert '<pre class="traceback" id="run-error">Traceback' in content
    assert "&lt;boom&gt;" in content  # escaped
    assert "0.6250" in content and "eval/reward/mean" in content
    assert "Promote to model" in content
    assert "step 1 ok" in content
    assert "run.queued" in content
    # A finished run no longer polls and offers no commands.
    assert 'hx-trigger="every' not in content and "Cancel…" not in content


def test_the_run_page_lists_only_the_newest_checkpoints(owner_client: Client, lab: Lab) -> None:
    for step in range(3, 28):
        Checkpoint.objects.create(
            run=lab.run, attempt=lab.checkpoint.attempt, step=step, path=f"/c/{step}",
            reason="periodic",
        )  # fmt: skip
    response = owner_client.get(reverse("runs:run_detail", args=[lab.run.pk]))
    shown = [c.step for c in response.context["checkpoints"]]
    assert shown == list(range(27, 7, -1))  # 20 of 26, newest first
    content = response.content.decode()
    assert content.count("Promote to model") == 20
    assert f"/api/runs/{lab.run.pk}/checkpoints" in content  # where every one is


def test_the_annotator_sees_the_run_without_controls(
    teammate_annotator_client: Client, lab: Lab
) -> None:
    content = teammate_annotator_client.get(
        reverse("runs:run_detail", args=[lab.run.pk])
    ).content.decode()
    assert "Cancel…" not in content and "Promote to model" not in content
    assert 'id="overrides"' not in content


def test_the_live_part_is_a_fragment(owner_client: Client, lab: Lab) -> None:
    url = reverse("runs:run_detail", args=[lab.run.pk]) + "?part=live"
    content = owner_client.get(url, **HTMX).content.decode()
    assert content.lstrip().startswith('<section class="card" id="run-live"')
    assert "<html" not in content


def test_the_live_part_reloads_the_whole_page_once_the_run_has_ended(
    owner_client: Client, lab: Lab
) -> None:
    Run.objects.filter(pk=lab.run.pk).update(state=RunState.COMPLETED)
    url = reverse("runs:run_detail", args=[lab.run.pk]) + "?part=live"
    response = owner_client.get(url, **HTMX)
    assert response.status_code == 204
    assert response["HX-Refresh"] == "true"


def test_preempting_a_queued_run_is_a_message_not_an_error(owner_client: Client, lab: Lab) -> None:
    response = owner_client.post(reverse("runs:run_preempt", args=[lab.run.pk]), follow=True)
    assert response.status_code == 200
    assert "nothing to preempt" in response.content.decode()


def test_commands_on_a_finished_run_are_a_message(owner_client: Client, lab: Lab) -> None:
    Run.objects.filter(pk=lab.run.pk).update(state=RunState.COMPLETED)
    response = owner_client.post(reverse("runs:run_cancel", args=[lab.run.pk]), follow=True)
    assert response.status_code == 200
    assert "already completed" in response.content.decode()
    response = owner_client.post(
        reverse("runs:run_overrides", args=[lab.run.pk]), {"kl_coef": "0.1"}, follow=True
    )
    assert "already completed" in response.content.decode()


def test_empty_or_bad_overrides_are_refused_with_a_message(owner_client: Client, lab: Lab) -> None:
    url = reverse("runs:run_overrides", args=[lab.run.pk])
    content = owner_client.post(url, {}, follow=True).content.decode()
    assert "nothing to change" in content
    content = owner_client.post(url, {"kl_coef": "-1"}, follow=True).content.decode()
    assert "kl_coef: must be a number &gt;= 0" in content
    assert not RunCommand.objects.filter(run=lab.run).exists()


def test_the_list_filters_by_state(owner_client: Client, lab: Lab) -> None:
    launch(lab.people, name="still-queued")
    Run.objects.filter(pk=lab.run.pk).update(state=RunState.FAILED)
    content = owner_client.get(reverse("runs:run_list") + "?state=failed", **HTMX).content.decode()
    assert "parity-run" in content and "still-queued" not in content
    content = owner_client.get(reverse("runs:run_list") + "?state=nonsense").content.decode()
    assert "parity-run" in content and "still-queued" in content


# --- models ---------------------------------------------------------------------------------


def test_a_promoted_version_shows_its_lineage_back_to_the_base_model(
    owner_client: Client, lab: Lab
) -> None:
    version = services.checkpoint_promote(
        actor=lab.people.owner, checkpoint=lab.checkpoint, slug="tuned", title="Tuned"
    )
    listing = owner_client.get(reverse("runs:model_list")).content.decode()
    assert "promoted from run" in listing and "parity-run</a> step 2" in listing
    page = owner_client.get(
        reverse("runs:model_version", args=[version.model_id, version.number])
    ).content.decode()
    assert "tuned v1" in page and "base v1" in page
    assert reverse("runs:run_detail", args=[lab.run.pk]) in page
