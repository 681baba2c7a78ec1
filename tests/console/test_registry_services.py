"""Registry services against the real PostgreSQL: what they store, what they refuse, what they
audit, and that two publishers racing on one draft produce one published version."""

from __future__ import annotations

import io
import threading
import tracemalloc
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction

from console.audit.models import AuditEntry
from console.registry import services
from console.registry.models import (
    Domain,
    RubricVersion,
    SandboxImageVersion,
    Task,
    VersionStatus,
)
from tests.console.test_registry_factories import (
    VALID_SOURCE,
    VALID_YAML,
    jsonl,
    make_domain,
    make_image,
    make_rubric,
    task_rows,
)

pytestmark = pytest.mark.django_db


def upload(domain: Domain, user: Any, data: bytes, **kwargs: Any) -> services.UploadResult:
    options = {"held_out_fraction": 0.1, "split_seed": 0, **kwargs}
    return services.domain_upload_tasks(
        actor=user, domain=domain, stream=io.BytesIO(data), filename="tasks.jsonl", **options
    )


# --- domains ------------------------------------------------------------------------------------


def test_creating_a_domain_records_it_in_the_audit_log(people: Any) -> None:
    domain = make_domain(team=people.team, user=people.owner, default_mix_weight=2.5)
    entry = AuditEntry.objects.get(action="domain.create")
    assert entry.team == people.team and entry.actor == people.owner
    assert entry.target_id == str(domain.pk) and entry.before is None
    assert entry.after["slug"] == "math" and entry.after["default_mix_weight"] == 2.5


def test_a_duplicate_slug_in_the_same_team_is_refused_and_saves_nothing(people: Any) -> None:
    make_domain(team=people.team, user=people.owner)
    with pytest.raises(ValidationError) as caught:
        make_domain(team=people.team, user=people.owner, title="Other")
    assert caught.value.message_dict == {
        "slug": ["this team already has a domain with the slug 'math'"]
    }
    assert Domain.objects.count() == 1
    assert AuditEntry.objects.filter(action="domain.create").count() == 1


def test_the_same_slug_in_another_team_is_fine(people: Any) -> None:
    make_domain(team=people.team, user=people.owner)
    make_domain(team=people.other_team, user=people.outsider)
    assert Domain.objects.filter(slug="math").count() == 2


def test_a_domain_cannot_use_another_teams_rubric_or_image(people: Any) -> None:
    foreign_rubric = make_rubric(team=people.other_team, user=people.outsider)
    foreign_image = make_image(team=people.other_team, user=people.outsider)
    with pytest.raises(ValidationError, match="choose a rubric of this team"):
        make_domain(team=people.team, user=people.owner, rubric=foreign_rubric)
    with pytest.raises(ValidationError, match="choose a sandbox image of this team"):
        make_domain(team=people.team, user=people.owner, sandbox_image=foreign_image)
    assert not Domain.objects.filter(team=people.team).exists()


@pytest.mark.parametrize("weight", [-0.5, float("inf"), float("nan")])
def test_a_negative_or_non_finite_mix_weight_is_refused(people: Any, weight: float) -> None:
    with pytest.raises(ValidationError, match="must be a number ≥ 0"):
        make_domain(team=people.team, user=people.owner, default_mix_weight=weight)


def test_the_database_itself_refuses_a_negative_mix_weight(people: Any) -> None:
    domain = make_domain(team=people.team, user=people.owner)
    with pytest.raises(IntegrityError), transaction.atomic():
        Domain.objects.filter(pk=domain.pk).update(default_mix_weight=-1)


def test_updating_a_domain_audits_before_and_after(people: Any) -> None:
    domain = make_domain(team=people.team, user=people.owner)
    services.domain_update(actor=people.teammate_researcher, domain=domain, title="Arithmetic")
    entry = AuditEntry.objects.get(action="domain.update")
    assert entry.before["title"] == "Math" and entry.after["title"] == "Arithmetic"
    assert entry.actor == people.teammate_researcher


# --- task-set upload ----------------------------------------------------------------------------


def test_an_upload_stores_every_task_with_a_seeded_split(people: Any) -> None:
    domain = make_domain(team=people.team, user=people.owner)
    result = upload(
        domain, people.owner, jsonl(task_rows(200)), held_out_fraction=0.25, split_seed=3
    )
    assert result.stored and result.valid == 200 and result.invalid == 0
    domain.refresh_from_db()
    assert domain.task_count == 200 and domain.taskset_version == 1
    held = set(Task.objects.filter(domain=domain, split="held_out").values_list("index", flat=True))
    assert domain.held_out_count == len(held) == result.held_out
    assert 25 <= len(held) <= 75
    # Same seed, same split: a second upload of the same file holds out the same tasks.
    upload(domain, people.owner, jsonl(task_rows(200)), held_out_fraction=0.25, split_seed=3)
    assert held == set(
        Task.objects.filter(domain=domain, split="held_out").values_list("index", flat=True)
    )
    assert AuditEntry.objects.filter(action="domain.upload_tasks").count() == 2


def test_one_invalid_row_stores_nothing_and_keeps_the_old_task_set(people: Any) -> None:
    domain = make_domain(team=people.team, user=people.owner)
    upload(domain, people.owner, jsonl(task_rows(5)))
    rows = jsonl(task_rows(3000)) + b'{"prompt": "broken"\n' + jsonl(task_rows(10))
    result = upload(domain, people.owner, rows)
    assert not result.stored
    assert [(e.line_number, e.message[:12]) for e in result.errors] == [(3001, "broken JSON:")]
    assert result.valid == 3010 and result.invalid == 1
    domain.refresh_from_db()
    assert domain.task_count == 5 and domain.taskset_version == 1
    assert Task.objects.filter(domain=domain).count() == 5
    assert AuditEntry.objects.filter(action="domain.upload_tasks").count() == 1


def test_keeping_the_valid_rows_stores_them_and_reports_the_rest(people: Any) -> None:
    domain = make_domain(team=people.team, user=people.owner)
    data = jsonl(task_rows(2)) + b'{"ground_truth": 1}\n' + jsonl(task_rows(2, start=2))
    result = upload(domain, people.owner, data, keep_valid_rows=True)
    assert result.stored and result.valid == 4 and result.invalid == 1
    assert result.errors[0].line_number == 3
    lines = list(Task.objects.filter(domain=domain).values_list("index", "line_number"))
    assert lines == [(0, 1), (1, 2), (2, 4), (3, 5)]


def test_a_file_with_no_valid_rows_stores_nothing_even_when_keeping_valid_rows(
    people: Any,
) -> None:
    domain = make_domain(team=people.team, user=people.owner)
    result = upload(domain, people.owner, b"not json\n", keep_valid_rows=True)
    assert not result.stored and result.file_error == "no row is valid, so nothing was stored"
    empty = upload(domain, people.owner, b"\n\n")
    assert not empty.stored and empty.file_error == "the file holds no tasks"


def test_a_utf16_file_is_refused_whole(people: Any) -> None:
    domain = make_domain(team=people.team, user=people.owner)
    result = upload(domain, people.owner, '{"prompt": "a", "ground_truth": 1}\n'.encode("utf-16"))
    assert not result.stored and "UTF-16" in result.file_error
    assert not Task.objects.exists()


def test_a_line_over_the_limit_is_reported_by_number(people: Any) -> None:
    domain = make_domain(team=people.team, user=people.owner)
    long_row = jsonl([{"prompt": "x" * 5000, "ground_truth": 1}])
    result = upload(domain, people.owner, jsonl(task_rows(1)) + long_row, max_line_bytes=1000)
    assert not result.stored
    assert result.errors[0].line_number == 2
    assert result.errors[0].message == "line is longer than the limit of 1,000 bytes"


def test_only_the_first_errors_are_listed_but_all_are_counted(people: Any) -> None:
    domain = make_domain(team=people.team, user=people.owner)
    result = upload(domain, people.owner, b"{}\n" * 500)
    assert result.invalid == 500 and len(result.errors) == services.MAX_REPORTED_ROW_ERRORS
    assert result.more_errors == 300


def test_resplitting_in_sql_gives_the_split_an_upload_would(people: Any) -> None:
    from console.registry.tasksets import held_out

    domain = make_domain(team=people.team, user=people.owner)
    rows = task_rows(600)
    rows[5]["split"] = "held_out"  # named by the file: stays whatever the new split says
    rows[6]["split"] = "train"
    upload(domain, people.owner, jsonl(rows), held_out_fraction=0.1, split_seed=1)
    services.domain_resplit(actor=people.owner, domain=domain, held_out_fraction=0.3, split_seed=9)
    stored = dict(Task.objects.filter(domain=domain).values_list("index", "split"))
    expected = {i: "held_out" if held_out(9, i, 0.3) else "train" for i in range(600)}
    expected[5], expected[6] = "held_out", "train"
    assert stored == expected
    domain.refresh_from_db()
    assert (domain.held_out_fraction, domain.split_seed) == (0.3, 9)
    assert domain.held_out_count == sum(1 for split in expected.values() if split == "held_out")
    # A fresh upload with the same fraction and seed agrees row for row.
    fresh = make_domain(team=people.team, user=people.owner, slug="fresh")
    upload(fresh, people.owner, jsonl(rows), held_out_fraction=0.3, split_seed=9)
    assert dict(Task.objects.filter(domain=fresh).values_list("index", "split")) == expected
    entry = AuditEntry.objects.get(action="domain.resplit")
    assert entry.before["held_out_fraction"] == 0.1 and entry.after["held_out_fraction"] == 0.3


@pytest.mark.slow
def test_a_100000_line_upload_streams_with_bounded_memory(people: Any, tmp_path: Any) -> None:
    domain = make_domain(team=people.team, user=people.owner)
    path = tmp_path / "big.jsonl"
    padding = "p" * 300
    with path.open("wb") as out:
        for n in range(100_000):
            out.write(
                jsonl([{"prompt": f"{n} {padding}", "ground_truth": n, "metadata": {"n": n}}])
            )
    file_size = path.stat().st_size
    assert file_size > 30_000_000
    tracemalloc.start()
    try:
        with path.open("rb") as stream:
            result = services.domain_upload_tasks(
                actor=people.owner,
                domain=domain,
                stream=stream,
                filename="big.jsonl",
                held_out_fraction=0.05,
                split_seed=1,
            )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.stored and result.valid == 100_000
    assert Task.objects.filter(domain=domain).count() == 100_000
    # Rows stream to the server one at a time: the peak is a small fraction of the 30 MB file
    # (reading it whole, or keeping every row, would exceed the file's size).
    assert peak < file_size / 10, f"peak {peak:,} bytes for a {file_size:,}-byte file"


# --- rubrics ------------------------------------------------------------------------------------


def test_a_new_rubric_is_draft_version_1(people: Any) -> None:
    rubric = make_rubric(team=people.team, user=people.owner)
    version = rubric.versions.get()
    assert version.number == 1 and version.status == VersionStatus.DRAFT
    assert version.spec["criteria"][0]["name"] == "correct"
    assert AuditEntry.objects.filter(action="rubric.create", target_id=str(rubric.pk)).exists()


def test_an_invalid_spec_is_refused_with_each_issue_at_its_path(people: Any) -> None:
    source = (
        '{"version": 1, "criteria": [{"name": "a", "kind": "exact_match"},'
        ' {"name": "b", "kind": "nope"}, {"name": "c", "kind": "exact_match", "weight": -1}]}'
    )
    with pytest.raises(ValidationError) as caught:
        make_rubric(team=people.team, user=people.owner, source=source)
    messages = caught.value.message_dict["source"]
    assert any(m.startswith("criteria[1].kind: unknown kind 'nope'") for m in messages)
    assert "criteria[2].weight: must be a number ≥ 0" in messages
    assert not RubricVersion.objects.exists()


@pytest.mark.parametrize(
    ("source", "source_format", "expected"),
    [
        ('{"version": 1,', "json", "JSON syntax: Expecting property name"),
        ("version: 1\ncriteria: [\n", "yaml", "YAML syntax:"),
        ("a: &x [1]\nb: *x\n", "yaml", "YAML aliases (*name) are not allowed"),
        ('{"version": 1, "criteria": [], "w": NaN}', "json", "NaN is not a number JSON allows"),
        ("", "json", "the spec is empty"),
        ("[1, 2]", "json", "a rubric spec must be a JSON object"),
    ],
)
def test_unparseable_specs_get_a_clear_message(
    people: Any, source: str, source_format: str, expected: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        make_rubric(team=people.team, user=people.owner, source=source, source_format=source_format)
    assert expected in caught.value.message_dict["source"][0]


def test_publishing_freezes_a_version_and_editing_starts_a_new_draft(people: Any) -> None:
    rubric = make_rubric(team=people.team, user=people.owner)
    draft = services.rubric_save_draft(
        actor=people.owner, rubric=rubric, source=VALID_YAML, source_format="yaml"
    )
    assert draft.number == 1  # the draft was edited in place
    published = services.rubric_version_publish(actor=people.teammate_researcher, version=draft)
    assert published.status == VersionStatus.PUBLISHED
    assert published.published_by == people.teammate_researcher and published.published_at
    new_draft = services.rubric_save_draft(
        actor=people.owner, rubric=rubric, source=VALID_SOURCE, source_format="json"
    )
    assert new_draft.number == 2 and new_draft.is_draft
    published.refresh_from_db()
    assert published.source == VALID_YAML and published.spec["criteria"][0]["kind"] == "exact_match"
    with pytest.raises(services.VersionConflict, match="already published"):
        services.rubric_version_publish(actor=people.owner, version=published)
    actions = list(AuditEntry.objects.order_by("id").values_list("action", flat=True))
    assert actions == ["rubric.create", "rubric.save_draft", "rubric.publish", "rubric.save_draft"]


def test_the_database_allows_one_draft_per_rubric(people: Any) -> None:
    rubric = make_rubric(team=people.team, user=people.owner)
    with pytest.raises(IntegrityError), transaction.atomic():
        RubricVersion.objects.create(
            rubric=rubric,
            number=2,
            source="{}",
            source_format="json",
            spec={},
            created_by=people.owner,
        )


@pytest.mark.django_db(transaction=True)
def test_two_researchers_publishing_one_draft_at_once_publish_it_once(people: Any) -> None:
    rubric = make_rubric(team=people.team, user=people.owner)
    draft = rubric.versions.get()
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def publish(user: Any) -> None:
        try:
            barrier.wait(timeout=10)
            services.rubric_version_publish(actor=user, version=draft)
            outcomes.append("published")
        except services.VersionConflict:
            outcomes.append("conflict")
        finally:
            connection.close()

    threads = [
        threading.Thread(target=publish, args=(user,))
        for user in (people.owner, people.teammate_researcher)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outcomes) == ["conflict", "published"]
    assert RubricVersion.objects.filter(rubric=rubric, status="published").count() == 1
    assert AuditEntry.objects.filter(action="rubric.publish").count() == 1


def test_a_stale_publish_loses_to_the_conditional_update(people: Any) -> None:
    """Even a caller holding an old copy of the row cannot publish a version twice."""
    rubric = make_rubric(team=people.team, user=people.owner)
    stale = rubric.versions.get()
    services.rubric_version_publish(actor=people.owner, version=stale)
    with pytest.raises(services.VersionConflict):
        services._publish(stale, people.teammate_researcher)
    stale.refresh_from_db()
    assert stale.published_by == people.owner


# --- sandbox images -----------------------------------------------------------------------------


def test_a_sandbox_image_starts_as_draft_version_1_with_default_limits(people: Any) -> None:
    image = make_image(team=people.team, user=people.owner)
    version = image.versions.get()
    assert version.number == 1 and version.is_draft and version.driver == "bwrap"
    assert version.limits() == {
        "cpu": 1.0,
        "memory_mb": 1024,
        "pids": 256,
        "disk_mb": 1024,
        "timeout_s": 60,
        "network": "none",
    }


@pytest.mark.parametrize(
    ("values", "field", "message"),
    [
        ({"memory_mb": 0}, "memory_mb", "must be between 16 and 2,097,152"),
        ({"cpu": "two"}, "cpu", "must be a number"),
        ({"timeout_s": 1.5}, "timeout_s", "must be a whole number"),
        ({"network": "host"}, "network", "choose none or loopback"),
        ({"driver": "lxc"}, "driver", "choose bwrap, podman or docker"),
        ({"driver": "docker"}, "image_ref", "docker needs an image reference"),
        ({"driver": "podman", "image_ref": "Not An Image!"}, "image_ref", "not an image reference"),
        ({"image_ref": "/srv/root"}, "image_ref", "start from the host's read-only system"),
        ({"pids": 3}, "pids", "must be between 4 and"),
        (
            {"driver": "docker", "image_ref": "python:3.11", "setup_script": "pip install x"},
            "setup_script",
            "bake the setup into the image",
        ),
        ({"gpu": 1}, "gpu", "unknown field"),
    ],
)
def test_bad_sandbox_limits_are_refused_with_a_clear_message(
    people: Any, values: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        make_image(team=people.team, user=people.owner, **values)
    assert any(message in text for text in caught.value.message_dict[field])
    assert not SandboxImageVersion.objects.exists()


def test_container_images_accept_real_references(people: Any) -> None:
    for n, ref in enumerate(
        ["python:3.11-slim", "ghcr.io/org/sandbox:v2", "localhost:5000/x/y@sha256:" + "a" * 64]
    ):
        make_image(
            team=people.team, user=people.owner, slug=f"img-{n}", driver="podman", image_ref=ref
        )
    assert SandboxImageVersion.objects.count() == 3


def test_a_version_gives_a_spec_the_sandboxes_library_accepts(people: Any) -> None:
    from sandboxes import SandboxSpec

    image = make_image(team=people.team, user=people.owner, setup_script="echo ready")
    spec = image.versions.get().sandbox_spec()
    assert spec["image"] == {
        "name": "lab.python-bwrap.v1",
        "setup": "echo ready",
        "network": "none",
    }
    built = SandboxSpec.from_dict(spec)
    assert (built.memory_mb, built.pids, built.network) == (1024, 256, "none")
    plain = make_image(team=people.team, user=people.owner, slug="plain").versions.get()
    assert plain.sandbox_spec()["image"] is None  # the host's read-only system
    oci = make_image(
        team=people.team, user=people.owner, slug="oci", driver="podman", image_ref="python:3.11"
    ).versions.get()
    assert SandboxSpec.from_dict(oci.sandbox_spec()).image == "python:3.11"


def test_sandbox_image_versions_publish_and_redraft_like_rubrics(people: Any) -> None:
    image = make_image(team=people.team, user=people.owner)
    services.sandbox_image_version_publish(actor=people.owner, version=image.versions.get())
    draft = services.sandbox_image_save_draft(actor=people.owner, image=image, memory_mb=2048)
    assert draft.number == 2 and draft.memory_mb == 2048 and draft.is_draft
    again = services.sandbox_image_save_draft(actor=people.owner, image=image, memory_mb=4096)
    assert again.pk == draft.pk and again.memory_mb == 4096
    assert image.versions.get(number=1).memory_mb == 1024
    with pytest.raises(services.VersionConflict):
        services.sandbox_image_version_publish(
            actor=people.owner, version=image.versions.get(number=1)
        )


# --- the demo seed ------------------------------------------------------------------------------


def test_the_demo_seed_is_complete_and_idempotent(people: Any) -> None:
    from console.registry.demo import HELD_OUT_TASKS, TRAIN_TASKS, seed_registry

    domains = seed_registry(team=people.team, user=people.owner)
    assert [d.slug for d in domains] == ["arithmetic", "json-format", "code", "parity"]
    for domain in domains:
        assert domain.task_count == TRAIN_TASKS + HELD_OUT_TASKS
        assert domain.held_out_count == HELD_OUT_TASKS
        assert domain.sandbox_image is not None
        assert domain.sandbox_image.versions.get().status == VersionStatus.PUBLISHED
    with_rubric = [d for d in domains if d.rubric is not None]
    assert {d.slug for d in with_rubric} >= {"arithmetic", "json-format"}
    for domain in with_rubric:
        assert domain.rubric.versions.get().status == VersionStatus.PUBLISHED
    entries = AuditEntry.objects.count()
    again = seed_registry(team=people.team, user=people.owner)
    assert [d.pk for d in again] == [d.pk for d in domains]
    assert AuditEntry.objects.count() == entries
