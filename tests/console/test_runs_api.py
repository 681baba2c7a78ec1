"""The runs API: the role matrix on every endpoint, and launch documents that are refused with
their path and save nothing. (Execution on real workers: test_runs_execution.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from console.registry.demo import seed_demo_domain
from console.runs import services
from console.runs.launch import default_document
from console.runs.models import Checkpoint, Host, Run, RunCommand, TrajectoryRecord
from console.runs.sink import ConsoleSink
from tests.console.factories import ANONYMOUS, EVERYONE, OUTSIDER, READERS, WRITERS, attempt_create
from tests.console.test_runs_sink import trajectory
from training.demo.domains import get_domain

pytestmark = pytest.mark.django_db


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


@pytest.fixture
def registry(people: Any, model_dir: Path) -> Any:
    services.model_register(
        actor=people.owner, team=people.team, slug="demo", title="Demo", path=str(model_dir)
    )
    return seed_demo_domain(
        team=people.team, user=people.owner, demo=get_domain("parity"), image=None
    )


def document(**changes: Any) -> dict[str, Any]:
    doc = default_document(model="demo", domains=[("parity", 1.0)])
    doc["name"] = "parity-test"
    doc.update(changes)
    return doc


def post(client: Any, url: str, body: Any) -> Any:
    return client.post(url, data=json.dumps(body), content_type="application/json")


@pytest.fixture
def run(people: Any, registry: Any, settings: Any, tmp_path: Path) -> Run:
    """A launched run that ran a step on a host: a trajectory, a checkpoint, a log."""
    settings.RUNS_ROOT = tmp_path / "runs"
    launched = services.run_launch(actor=people.owner, team=people.team, document=document())
    host = Host.objects.create(name="h1", cpu_slots=1)
    attempt = attempt_create(launched, host, state="running")
    Run.objects.filter(pk=launched.pk).update(state="running")
    sink = ConsoleSink(attempt)
    sink.trajectories([trajectory(1, 0, reward=0.0), trajectory(1, 1, reward=1.0)])
    sink.metrics(1, {"reward/mean": 0.5})
    checkpoint_dir = tmp_path / "ckpt"
    (checkpoint_dir / "hf").mkdir(parents=True)  # the layout training.checkpoint saves
    (checkpoint_dir / "hf" / "config.json").write_text("{}")
    sink.checkpoint({"step": 1, "path": str(checkpoint_dir), "reason": "periodic"})
    services.attempt_append_log(attempt.pk, "step 1 done\n")
    return Run.objects.get(pk=launched.pk)


READS = [
    "/api/runs/{id}",
    "/api/runs/{id}/metrics?keys=reward/mean",
    "/api/runs/{id}/trajectories",
    "/api/runs/{id}/events",
    "/api/runs/{id}/checkpoints",
    "/api/runs/{id}/logs",
    "/api/runs/{id}/trajectories.jsonl",
    "/api/runs/{id}/metrics.csv",
    "/api/runs/{id}/trajectories.parquet",
]


@pytest.mark.parametrize("who", EVERYONE)
@pytest.mark.parametrize("url", READS)
def test_run_reads_follow_the_role_matrix(who, url, run, api_client_as):
    response = api_client_as(who).get(url.format(id=run.pk))
    expected = 200 if who in READERS else 401 if who == ANONYMOUS else 404
    assert response.status_code == expected, response.content


@pytest.mark.parametrize("who", EVERYONE)
def test_lists_show_only_the_callers_team(who, run, api_client_as):
    response = api_client_as(who).get("/api/runs")
    if who == ANONYMOUS:
        assert response.status_code == 401
        return
    names = [item["name"] for item in response.json()["items"]]
    assert names == ([] if who == OUTSIDER else ["parity-test"])
    models = [m["slug"] for m in api_client_as(who).get("/api/models").json()["items"]]
    assert models == ([] if who == OUTSIDER else ["demo"])
    assert api_client_as(who).get("/api/hosts").status_code == 200


WRITES = [
    ("/api/runs/{id}/overrides", {"temperature": 0.8}),
    ("/api/runs/{id}/preempt", {"reason": "make room"}),
    ("/api/runs/{id}/cancel", {}),
    ("/api/checkpoints/{checkpoint}/promote", {"slug": "parity-step1"}),
]


@pytest.mark.parametrize("who", EVERYONE)
@pytest.mark.parametrize(("url", "body"), WRITES)
def test_run_writes_follow_the_role_matrix(who, url, body, run, api_client_as):
    checkpoint = Checkpoint.objects.get(run=run)
    response = post(api_client_as(who), url.format(id=run.pk, checkpoint=checkpoint.pk), body)
    if who in WRITERS:
        assert response.status_code in (200, 201), response.content
    else:
        assert response.status_code == {ANONYMOUS: 401, OUTSIDER: 404}.get(who, 403)
        assert not RunCommand.objects.exists()
        assert Run.objects.get(pk=run.pk).state == "running"


@pytest.mark.parametrize("who", EVERYONE)
def test_launch_follows_the_role_matrix(who, registry, api_client_as, settings, tmp_path):
    settings.RUNS_ROOT = tmp_path / "runs"
    response = post(api_client_as(who), "/api/runs", {"spec": document()})
    if who in WRITERS:
        assert response.status_code == 201, response.content
        assert Run.objects.get().state == "queued"
    else:
        assert response.status_code in {ANONYMOUS: (401,), OUTSIDER: (422,)}.get(who, (403,))
        assert not Run.objects.exists()


def test_an_outsider_cannot_launch_on_another_teams_domain(registry, api_client_as):
    # The outsider's token names the parity domain of a team that is not theirs.
    response = post(api_client_as(OUTSIDER), "/api/runs", {"spec": document()})
    assert response.status_code == 422
    errors = response.json()["errors"]
    assert "no domain 'parity' in your team" in errors["domains[0].domain"]
    assert "no model 'demo' in your team" in errors["base_model"]


BAD = [
    ({"colour": "red"}, "colour", "unknown field"),
    ({"max_steps": "many"}, "max_steps", "must be"),
    ({"domains": [{"domain": "parity", "weight": -1}]}, "domains[0].weight", ">= 0"),
    ({"domains": [{"domain": "parity", "weight": 0}]}, "domains", "weight > 0"),
    ({"domains": [{"domain": "nope"}]}, "domains[0].domain", "no domain 'nope'"),
    ({"domains": []}, "domains", "non-empty"),
    ({"domains": [{"domain": "parity", "tasks": []}]}, "domains[0].tasks", "pinned"),
    ({"output_dir": "/tmp/x"}, "output_dir", "set by the console"),
    ({"checkpoint": {"resume": "/x"}}, "checkpoint.resume", "set by the console"),
    ({"checkpoint": {"prune": True}}, "checkpoint.prune", "set by the console"),
    ({"base_model": "demo@9"}, "base_model", "no model 'demo@9'"),
    ({"name": "bad name!"}, "name", "letters"),
    ({"batch": {"group_size": 0}}, "batch.group_size", ">= "),
]


@pytest.mark.parametrize(("change", "path", "message"), BAD)
def test_a_bad_launch_document_is_refused_at_its_path_and_saves_nothing(
    change, path, message, registry, api_client_as, settings, tmp_path
):
    settings.RUNS_ROOT = tmp_path / "runs"
    doc = document()
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(doc.get(key), dict):
            doc[key] = {**doc[key], **value}
        else:
            doc[key] = value
    response = post(api_client_as("owner"), "/api/runs", {"spec": doc})
    assert response.status_code == 422, response.content
    errors = response.json()["errors"]
    assert path in errors, errors
    assert any(message in text for text in errors[path]), errors
    assert not Run.objects.exists()
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_domain_whose_rubric_has_no_published_version_cannot_be_launched(
    registry, people, api_client_as
):
    from console.registry import services as registry_services

    rubric = registry.rubric
    registry_services.rubric_save_draft(
        actor=people.owner, rubric=rubric, source=rubric.versions.get().source,
        source_format="yaml",
    )  # fmt: skip
    rubric.versions.filter(number=1).delete()
    response = post(api_client_as("owner"), "/api/runs", {"spec": document()})
    assert response.status_code == 422
    [message] = response.json()["errors"]["domains[0].domain"]
    assert "no published version" in message
    assert not Run.objects.exists()


def test_launch_pins_the_published_versions_and_later_registry_edits_change_nothing(
    registry, people, api_client_as, settings, tmp_path
):
    settings.RUNS_ROOT = tmp_path / "runs"
    response = post(api_client_as("owner"), "/api/runs", {"spec": document()})
    run = Run.objects.get(pk=response.json()["id"])
    [pin] = run.pins["domains"]
    assert pin["rubric_version"] == 1 and pin["taskset_version"] == registry.taskset_version
    assert run.spec["domains"][0]["rubric_version"] == 1
    spec_before = json.dumps(run.spec, sort_keys=True)
    registry.default_mix_weight = 5.0
    registry.save()
    run.refresh_from_db()
    assert json.dumps(run.spec, sort_keys=True) == spec_before


def test_trajectories_page_with_a_cursor_and_filters(run, api_client_as):
    api = api_client_as("owner")
    first = api.get(f"/api/runs/{run.pk}/trajectories?limit=1").json()
    assert [item["index"] for item in first["items"]] == [0]
    second = api.get(
        f"/api/runs/{run.pk}/trajectories?limit=1&cursor={first['next_cursor']}"
    ).json()
    assert [item["index"] for item in second["items"]] == [1]
    assert second["next_cursor"] is None
    rewarded = api.get(f"/api/runs/{run.pk}/trajectories?min_reward=0.5").json()["items"]
    assert [item["reward"] for item in rewarded] == [1.0]
    assert api.get(f"/api/runs/{run.pk}/trajectories?cursor=x").status_code == 422
    assert TrajectoryRecord.objects.count() == 2


def test_cancelling_a_queued_run_ends_it_and_a_finished_run_refuses_commands(
    registry, people, api_client_as, settings, tmp_path
):
    settings.RUNS_ROOT = tmp_path / "runs"
    launched = services.run_launch(actor=people.owner, team=people.team, document=document())
    api = api_client_as("owner")
    response = post(api, f"/api/runs/{launched.pk}/cancel", {"reason": "typo in lr"})
    assert response.status_code == 200
    assert response.json()["run"]["state"] == "cancelled"
    assert post(api, f"/api/runs/{launched.pk}/preempt", {}).status_code == 409


def test_promoting_a_checkpoint_makes_a_model_with_its_lineage(run, api_client_as, people):
    checkpoint = Checkpoint.objects.get(run=run)
    response = post(
        api_client_as("owner"), f"/api/checkpoints/{checkpoint.pk}/promote", {"slug": "rl-1"}
    )
    assert response.status_code == 201
    assert response.json()["source_run"] == run.pk and response.json()["source_step"] == 1
    from console.runs.models import ModelVersion

    version = ModelVersion.objects.get(model__slug="rl-1")
    lineage = services.model_lineage(version)
    assert [link["version"].model.slug for link in lineage] == ["rl-1", "demo"]
    # A promoted model is the base of the next run.
    doc = document(base_model="rl-1", name="stage-2")
    assert post(api_client_as("owner"), "/api/runs", {"spec": doc}).status_code == 201


def test_the_openapi_document_lists_the_runs_endpoints(api_client_as):
    paths = api_client_as("owner").get("/api/openapi.json").json()["paths"]
    for path in (
        "/api/runs", "/api/runs/{run_id}", "/api/runs/{run_id}/cancel",
        "/api/runs/{run_id}/preempt", "/api/runs/{run_id}/overrides",
        "/api/runs/{run_id}/metrics", "/api/runs/{run_id}/trajectories",
        "/api/runs/{run_id}/events", "/api/runs/{run_id}/checkpoints",
        "/api/runs/{run_id}/logs", "/api/checkpoints/{checkpoint_id}/promote",
        "/api/models", "/api/hosts",
    ):  # fmt: skip
        assert path in paths, path


def test_the_domains_registered_sandbox_image_is_pinned_into_the_run(
    registry, people, api_client_as, settings, tmp_path
):
    from console.registry import services as registry_services

    settings.RUNS_ROOT = tmp_path / "runs"
    image = registry_services.sandbox_image_create(
        actor=people.owner, team=people.team, slug="py-tools", title="Py tools",
        driver="bwrap", image_ref="", setup_script="echo ok > /image/ok", cpu=1.0,
        memory_mb=384, pids=48, disk_mb=128, timeout_s=7, network="none",
    )  # fmt: skip
    registry_services.sandbox_image_version_publish(
        actor=people.owner, version=image.versions.get()
    )
    registry.sandbox_image = image
    registry.save()
    response = post(api_client_as("owner"), "/api/runs", {"spec": document()})
    assert response.status_code == 201, response.content
    domain = Run.objects.get().spec["domains"][0]
    assert domain["sandbox_image"] == "py-tools@1"
    assert domain["sandbox"]["memory_mb"] == 384 and domain["sandbox"]["timeout_s"] == 7
    assert domain["sandbox"]["image"]["setup"] == "echo ok > /image/ok"


def test_exports_stream_the_filtered_trajectories_and_every_metric(run, api_client_as):
    api = api_client_as("owner")
    response = api.get(f"/api/runs/{run.pk}/trajectories.jsonl?min_reward=0.5")
    assert response["Content-Type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]
    assert [(line["step"], line["index"], line["reward"]["total"]) for line in lines] == [
        (1, 1, 1.0)
    ]
    assert lines[0]["attempt"] == 1 and lines[0]["reward"]["breakdown"] == {"answer": 1.0}
    everything = b"".join(api.get(f"/api/runs/{run.pk}/trajectories.jsonl").streaming_content)
    assert len(everything.splitlines()) == 2
    csv_text = b"".join(api.get(f"/api/runs/{run.pk}/metrics.csv").streaming_content).decode()
    assert csv_text.splitlines() == ["step,reward/mean", "1,0.5"]


def test_the_parquet_export_holds_the_same_rows_as_the_jsonl(run, api_client_as, tmp_path):
    import pyarrow.parquet as pq

    api = api_client_as("owner")
    response = api.get(f"/api/runs/{run.pk}/trajectories.parquet?domain=parity")
    assert response["Content-Type"] == "application/vnd.apache.parquet"
    path = tmp_path / "t.parquet"
    path.write_bytes(b"".join(response.streaming_content))
    table = pq.read_table(path).to_pylist()
    assert [(row["step"], row["index"], row["reward"]) for row in table] == [
        (1, 0, 0.0),
        (1, 1, 1.0),
    ]
    assert json.loads(table[1]["reward_breakdown"]) == {"answer": 1.0}
    assert json.loads(table[1]["trajectory"])["completion"] == "\\boxed{even}"
    assert table[0]["rubric_version"] == 3 and table[0]["attempt"] == 1
