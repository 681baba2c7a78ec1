"""What a team registers: domains with their task sets, reward rubrics and sandbox images.

Rubrics and sandbox images are versioned: a version is a draft (editable) until it is
published, after which it is frozen; runs pin a published version. The database enforces what
must never be false (unique names per team, one version number per parent, at most one draft
per parent, limits in range), so a bug in a service or a race cannot store it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q

from console.accounts.models import Team
from sandboxes import LIMITS as SANDBOX_LIMITS


class VersionStatus(models.TextChoices):
    DRAFT = "draft", "Draft"
    PUBLISHED = "published", "Published"


class SpecFormat(models.TextChoices):
    JSON = "json", "JSON"
    YAML = "yaml", "YAML"


class SandboxDriver(models.TextChoices):
    BWRAP = "bwrap", "bubblewrap"
    PODMAN = "podman", "Podman"
    DOCKER = "docker", "Docker"


class SandboxNetwork(models.TextChoices):
    NONE = "none", "None"
    LOOPBACK = "loopback", "Loopback only"


class TaskSplit(models.TextChoices):
    # training.tasks.SPLITS, the one vocabulary (tests/console/test_registry_tasksets.py checks).
    TRAIN = "train", "Train"
    HELD_OUT = "held_out", "Held out"


#: The limits a sandbox image version stores; the database keeps them as whole numbers,
#: except these (timeout_s is whole seconds here although a sandbox takes fractions).
SANDBOX_LIMIT_FIELDS = ("cpu", "memory_mb", "pids", "disk_mb", "timeout_s")
FRACTIONAL_LIMITS = frozenset({"cpu"})


def _stored_bounds(name: str) -> tuple[float, float]:
    bounds = SANDBOX_LIMITS[name]
    if name in FRACTIONAL_LIMITS:
        return (bounds.minimum, bounds.maximum)
    return (math.ceil(bounds.minimum), math.floor(bounds.maximum))


# Bounds on sandbox limits, shared by forms, the API and the database constraints. They come
# from the sandboxes library, which has the last word: a version inside them always starts.
LIMIT_BOUNDS: dict[str, tuple[float, float]] = {
    name: _stored_bounds(name) for name in SANDBOX_LIMIT_FIELDS
}


SANDBOX_SPEC_FIELDS = (
    "driver",
    "image_ref",
    "setup_script",
    "cpu",
    "memory_mb",
    "pids",
    "disk_mb",
    "timeout_s",
    "network",
)


def sandbox_spec_dict(values: dict[str, Any], *, image_name: str) -> dict[str, Any]:
    """A sandboxes-library spec from a version's fields. bwrap images are the host's read-only
    system plus the setup script, built once and cached by the library; container drivers take
    the OCI reference."""
    if values["driver"] == SandboxDriver.BWRAP:
        image: Any = None
        if values["setup_script"]:
            image = {
                "name": image_name,
                "setup": values["setup_script"],
                "network": values["network"],
            }
    else:
        image = values["image_ref"]
    return {
        "driver": values["driver"],
        "image": image,
        **{name: values[name] for name in SANDBOX_LIMIT_FIELDS},
        "network": values["network"],
    }


def format_bound(value: float) -> str:
    """1000000 as "1,000,000" and 0.05 as "0.05", for messages about limits."""
    return f"{int(value):,}" if value == int(value) else f"{value:g}"


class VersionedObject(models.Model):
    """A team-owned object with numbered versions (rubrics, sandbox images; next, base models):
    at most one version is a draft, publishing freezes it. The concrete class adds its `team`
    foreign key (each with its own related name) and its per-team unique slug."""

    slug = models.SlugField(max_length=64)
    title = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class ObjectVersion(models.Model):
    """One numbered version of a VersionedObject; the concrete class adds the foreign key to its
    object and the payload fields, and takes its constraints from `version_constraints`."""

    number = models.PositiveIntegerField()
    status = models.CharField(
        max_length=16, choices=VersionStatus.choices, default=VersionStatus.DRAFT
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    published_at = models.DateTimeField(null=True, blank=True)
    published_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )

    class Meta:
        abstract = True

    @property
    def is_draft(self) -> bool:
        return self.status == VersionStatus.DRAFT


def version_constraints(key: str, parent_field: str) -> list[models.BaseConstraint]:
    """What the database enforces for every kind's versions: one number per object, at most one
    draft, a known status, publish fields set exactly when published, numbers from 1."""
    return [
        models.UniqueConstraint(
            fields=[parent_field, "number"], name=f"{key}_version_number_unique"
        ),
        models.UniqueConstraint(
            fields=[parent_field],
            condition=Q(status="draft"),
            name=f"{key}_at_most_one_draft",
        ),
        models.CheckConstraint(
            condition=Q(status__in=["draft", "published"]), name=f"{key}_version_status_valid"
        ),
        models.CheckConstraint(
            condition=Q(status="draft", published_at__isnull=True)
            | Q(status="published", published_at__isnull=False, published_by__isnull=False),
            name=f"{key}_version_published_fields",
        ),
        models.CheckConstraint(condition=Q(number__gte=1), name=f"{key}_version_number_gte_1"),
    ]


class Rubric(VersionedObject):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="rubrics")

    class Meta(VersionedObject.Meta):
        constraints = [
            models.UniqueConstraint(fields=["team", "slug"], name="rubric_slug_unique_per_team")
        ]


class RubricVersion(ObjectVersion):
    rubric = models.ForeignKey(Rubric, on_delete=models.CASCADE, related_name="versions")
    # The text the author wrote (kept verbatim so comments and layout survive) and the parsed
    # spec that `rewards.Rubric.from_spec` consumes.
    source = models.TextField()
    source_format = models.CharField(max_length=8, choices=SpecFormat.choices)
    spec = models.JSONField()

    class Meta:
        ordering = ["rubric", "-number"]
        constraints = version_constraints("rubric", "rubric")

    def __str__(self) -> str:
        return f"{self.rubric.slug} v{self.number}"


class SandboxImage(VersionedObject):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="sandbox_images")

    class Meta(VersionedObject.Meta):
        constraints = [
            models.UniqueConstraint(
                fields=["team", "slug"], name="sandbox_image_slug_unique_per_team"
            )
        ]


class SandboxImageVersion(ObjectVersion):
    image = models.ForeignKey(SandboxImage, on_delete=models.CASCADE, related_name="versions")
    driver = models.CharField(max_length=16, choices=SandboxDriver.choices)
    # For podman/docker an OCI reference (registry/name:tag or @sha256:...); for bwrap the base
    # root filesystem directory ("" means the host's read-only root).
    image_ref = models.CharField(max_length=500, blank=True)
    setup_script = models.TextField(blank=True)
    cpu = models.FloatField()
    memory_mb = models.PositiveIntegerField()
    pids = models.PositiveIntegerField()
    disk_mb = models.PositiveIntegerField()
    timeout_s = models.PositiveIntegerField()
    network = models.CharField(
        max_length=16, choices=SandboxNetwork.choices, default=SandboxNetwork.NONE
    )

    class Meta:
        ordering = ["image", "-number"]
        constraints = [
            *version_constraints("sandbox_image", "image"),
            models.CheckConstraint(
                condition=Q(driver__in=["bwrap", "podman", "docker"]),
                name="sandbox_image_version_driver_valid",
            ),
            models.CheckConstraint(
                condition=Q(network__in=["none", "loopback"]),
                name="sandbox_image_version_network_valid",
            ),
            # Container drivers cannot start without an image to pull.
            models.CheckConstraint(
                condition=Q(driver="bwrap") | ~Q(image_ref=""),
                name="sandbox_image_version_container_needs_ref",
            ),
            *[
                models.CheckConstraint(
                    condition=Q(**{f"{field}__gte": low, f"{field}__lte": high}),
                    name=f"sandbox_image_version_{field}_in_range",
                )
                for field, (low, high) in LIMIT_BOUNDS.items()
            ],
        ]

    def __str__(self) -> str:
        return f"{self.image.slug} v{self.number}"

    def sandbox_spec(self) -> dict[str, Any]:
        """The plain spec `sandboxes.SandboxSpec.from_dict` takes for this version: what a run
        that pins the version starts its sandboxes with."""
        return sandbox_spec_dict(
            {name: getattr(self, name) for name in SANDBOX_SPEC_FIELDS},
            image_name=f"{self.image.team.slug}.{self.image.slug}.v{self.number}",
        )

    def limits(self) -> dict[str, object]:
        return {
            "cpu": self.cpu,
            "memory_mb": self.memory_mb,
            "pids": self.pids,
            "disk_mb": self.disk_mb,
            "timeout_s": self.timeout_s,
            "network": self.network,
        }


class Domain(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="domains")
    slug = models.SlugField(max_length=64)
    title = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    default_mix_weight = models.FloatField(default=1.0)
    rubric = models.ForeignKey(
        Rubric, on_delete=models.PROTECT, null=True, blank=True, related_name="domains"
    )
    sandbox_image = models.ForeignKey(
        SandboxImage, on_delete=models.PROTECT, null=True, blank=True, related_name="domains"
    )
    # The current task set: each upload is a new numbered version (0: none yet) and becomes
    # current; older versions' tasks are kept, since runs pin the version they trained on.
    # The other taskset_/count fields describe the current version.
    taskset_version = models.PositiveIntegerField(default=0)
    taskset_filename = models.CharField(max_length=255, blank=True)
    taskset_uploaded_at = models.DateTimeField(null=True, blank=True)
    task_count = models.PositiveIntegerField(default=0)
    held_out_count = models.PositiveIntegerField(default=0)
    held_out_fraction = models.FloatField(default=0.1)
    split_seed = models.BigIntegerField(default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.UniqueConstraint(fields=["team", "slug"], name="domain_slug_unique_per_team"),
            models.CheckConstraint(
                condition=Q(default_mix_weight__gte=0), name="domain_mix_weight_gte_0"
            ),
            models.CheckConstraint(
                condition=Q(held_out_fraction__gte=0, held_out_fraction__lte=1),
                name="domain_held_out_fraction_in_range",
            ),
            models.CheckConstraint(
                condition=Q(held_out_count__lte=models.F("task_count")),
                name="domain_held_out_count_lte_task_count",
            ),
        ]

    def __str__(self) -> str:
        return self.slug

    @property
    def train_count(self) -> int:
        return self.task_count - self.held_out_count


class Task(models.Model):
    domain = models.ForeignKey(Domain, on_delete=models.CASCADE, related_name="tasks")
    # The upload (the domain's task-set version) this task came in.
    taskset_version = models.PositiveIntegerField(default=1)
    # 0-based position in the uploaded file; line number = index + 1 (blank lines excepted).
    index = models.PositiveIntegerField()
    line_number = models.PositiveIntegerField()
    prompt = models.TextField(blank=True)
    messages = models.JSONField(null=True, blank=True)
    ground_truth = models.JSONField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    split = models.CharField(max_length=16, choices=TaskSplit.choices, default=TaskSplit.TRAIN)
    # The file named the split for this row; re-splitting the domain leaves such rows alone.
    split_from_file = models.BooleanField(default=False)

    class Meta:
        ordering = ["domain", "taskset_version", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["domain", "taskset_version", "index"], name="task_index_unique_per_version"
            ),
            models.CheckConstraint(
                condition=~Q(prompt="") | Q(messages__isnull=False),
                name="task_has_prompt_or_messages",
            ),
            models.CheckConstraint(
                condition=Q(split__in=["train", "held_out"]), name="task_split_valid"
            ),
        ]
        indexes = [
            models.Index(
                fields=["domain", "taskset_version", "split", "index"], name="task_version_split"
            )
        ]

    def __str__(self) -> str:
        return f"{self.domain_id}#{self.index}"

    # Shown in pages as JSON, the form they were uploaded in (not Python's repr).
    @property
    def ground_truth_json(self) -> str:
        return json.dumps(self.ground_truth, ensure_ascii=False)

    @property
    def metadata_json(self) -> str:
        return json.dumps(self.metadata, ensure_ascii=False)
