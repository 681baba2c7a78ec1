"""Writes for runs: launch, placement on hosts, the attempt lifecycle, operator commands,
models and promotion, and the host sweep.

Every state change is one conditional row update with its reason, recorded as a run event
(and, for what a person did, in the audit log). Celery messages are sent only after the
transaction that decided them commits, so a worker never looks for a row that is not there.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max, Q
from django.utils import timezone

from console.accounts.models import Team
from console.audit.services import audit_record
from console.broadcast import FLEET_RUNS_GROUP, broadcast_on_commit, team_group
from console.registry.models import Domain, TaskSplit, VersionStatus
from console.registry.services import snapshot
from console.runs.launch import (
    LaunchError,
    check_document_shape,
    split_model_reference,
)
from console.runs.models import (
    LIVE_ATTEMPT_STATES,
    Allocation,
    AllocationState,
    Attempt,
    AttemptState,
    Checkpoint,
    CommandKind,
    Host,
    HostState,
    ModelVersion,
    RegisteredModel,
    Run,
    RunCommand,
    RunEvent,
    RunState,
)

logger = logging.getLogger(__name__)


class AttemptNotCurrent(Exception):
    """A job wrote, or asked for its commands, as an attempt that is no longer its run's
    current one: the attempt was lost, preempted or ended, and the run may have moved on to a
    newer attempt, while the old job still runs (its host lost contact, or it had not yet seen
    its stop). What it sends is refused."""


# A run has at most one live attempt (the constraint attempt_one_live_per_run), so an attempt
# is its run's current one while it is live. Checked with KEY SHARE on the attempt's row,
# which is held until the caller's transaction ends: ending the attempt (`attempt_finished`,
# `_requeue_lost`: SELECT ... FOR UPDATE first) waits for a write in flight, and a write that
# comes after sees the attempt ended. A heartbeat (a plain UPDATE of other columns) does not
# wait. Take it first in a transaction, before the writes: they lock the run's row, which
# ending the attempt locks after the attempt's.
ATTEMPT_CURRENT = "id = %s AND state IN ({})".format(
    ", ".join(f"'{state}'" for state in LIVE_ATTEMPT_STATES)
)


def attempt_hold_current(attempt: Attempt) -> None:
    """Inside a transaction: raises `AttemptNotCurrent` unless `attempt` is live, and keeps it
    live until the transaction ends."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM runs_attempt WHERE {ATTEMPT_CURRENT} FOR KEY SHARE",  # noqa: S608
            [attempt.pk],
        )
        if cursor.fetchone() is None:
            raise attempt_not_current(attempt)


def attempt_not_current(attempt: Attempt) -> AttemptNotCurrent:
    """The refusal for `attempt`, saying what it is now and which attempt is current."""
    state = Attempt.objects.filter(pk=attempt.pk).values_list("state", flat=True).first()
    current = (
        Attempt.objects.filter(run_id=attempt.run_id, state__in=LIVE_ATTEMPT_STATES)
        .values_list("number", flat=True)
        .first()
    )
    now = f"attempt {current} is" if current else "no attempt is live"
    return AttemptNotCurrent(
        f"attempt {attempt.number} of run {attempt.run_id} is {state or 'gone'} and no longer "
        f"the run's current attempt ({now})"
    )


RUNS_TOPIC = "runs"
# The run notices that change the scheduler's pages (a run queued, placed, stopped, or its
# waiting reason changed).
SCHEDULING_EVENTS = frozenset({"run.created", "run.state"})


def run_group(run_id: int) -> str:
    """The channel-layer group of one run's live page."""
    return f"run.{run_id}"


def notify(
    run: Run, event: str, payload: dict[str, Any], *, to_lists: bool = True, wait: bool = True
) -> None:
    """A compact notice after commit to the run's page (and, with `to_lists`, to the team's
    run lists: state changes go there, per-batch notices do not). ``wait=False`` sends from a
    background thread (a job's sink must not wait for Redis)."""
    payload = {"run": run.pk, **payload}
    if to_lists:
        broadcast_on_commit(team_group(run.team_id, RUNS_TOPIC), event, payload, wait=wait)
        if event in SCHEDULING_EVENTS:
            # The scheduler's fleet-wide pages (queue for admins, fleet): a doorbell, no
            # payload, and not for each step's metrics (those pages show where runs are).
            broadcast_on_commit(FLEET_RUNS_GROUP, event, {}, wait=wait, doorbell=True)
    # The run's page only rings its reader (`RunLiveConsumer` reads what is newer): doorbells.
    broadcast_on_commit(run_group(run.pk), event, payload, wait=wait, doorbell=True)


def record_event(
    run: Run, kind: str, data: dict[str, Any], *, attempt: Attempt | None = None
) -> RunEvent:
    step = data.get("step")
    return RunEvent.objects.create(
        run=run,
        attempt=attempt,
        kind=kind,
        step=step if isinstance(step, int) and step >= 0 else None,
        data=data,
    )


def _set_run_state(run: Run, state: str, reason: str, **fields: Any) -> None:
    old = run.state
    run.state = state
    run.state_reason = reason[:2000]
    for name, value in fields.items():
        setattr(run, name, value)
    run.save(update_fields=["state", "state_reason", *fields])
    record_event(run, "run.state", {"from": old, "to": state, "reason": reason})
    notify(run, "run.state", {"state": state, "reason": reason})


# --- models ---------------------------------------------------------------------------------


def model_register(
    *, actor: Any, team: Team, slug: str, title: str, path: str, description: str = ""
) -> ModelVersion:
    """A new model (or a new version of the team's model `slug`) whose weights are at `path`."""
    from django.core.exceptions import ValidationError

    if not (Path(path) / "config.json").is_file():
        raise ValidationError({"path": [f"{path} is not a model directory (no config.json)"]})
    with transaction.atomic():
        model, created = RegisteredModel.objects.get_or_create(
            team=team,
            slug=slug,
            defaults={"title": title, "description": description, "created_by": actor},
        )
        version = _model_version_create(actor=actor, model=model, path=path, source=None)
        audit_record(
            actor=actor,
            team=team,
            action="model.register",
            target=version,
            before=None,
            after=snapshot(version),
        )
    return version


def _model_version_create(
    *, actor: Any, model: RegisteredModel, path: str, source: Checkpoint | None
) -> ModelVersion:
    number = (model.versions.aggregate(n=Max("number"))["n"] or 0) + 1
    now = timezone.now()
    return ModelVersion.objects.create(
        model=model,
        number=number,
        path=path,
        source_checkpoint=source,
        status=VersionStatus.PUBLISHED,
        created_by=actor,
        published_at=now,
        published_by=actor,
    )


def checkpoint_promote(
    *, actor: Any, checkpoint: Checkpoint, slug: str, title: str = ""
) -> ModelVersion:
    """Makes a checkpoint a model version (new model `slug`, or its next version), so it can be
    the base of the next run; the version's lineage points back to the checkpoint."""
    from django.core.exceptions import ValidationError

    from console.registry.services import _check_slug

    try:
        _check_slug(slug)
    except ValidationError as error:
        raise ValidationError({"slug": error.messages}) from None
    from training.checkpoint import hf_copy

    weights = hf_copy(checkpoint.path)
    if not (weights / "config.json").is_file():
        raise ValidationError(
            {"checkpoint": ["its weights are no longer on disk (only the newest few are kept)"]}
        )
    run = checkpoint.run
    with transaction.atomic():
        model, _ = RegisteredModel.objects.get_or_create(
            team=run.team,
            slug=slug,
            defaults={
                "title": title or slug,
                "created_by": actor,
                "description": f"Promoted from run {run.name} step {checkpoint.step}",
            },
        )
        version = _model_version_create(
            actor=actor, model=model, path=str(weights), source=checkpoint
        )
        audit_record(
            actor=actor,
            team=run.team,
            action="checkpoint.promote",
            target=version,
            before=None,
            after=snapshot(version),
        )
        record_event(
            run,
            "checkpoint.promoted",
            {"step": checkpoint.step, "model": slug, "version": version.number},
        )
    return version


def model_lineage(version: ModelVersion) -> list[dict[str, Any]]:
    """From this version back to its base model: each version, and the run and checkpoint it
    was promoted from."""
    chain: list[dict[str, Any]] = []
    current: ModelVersion | None = version
    seen: set[int] = set()
    while current is not None and current.pk not in seen:
        seen.add(current.pk)
        checkpoint = current.source_checkpoint
        chain.append(
            {
                "version": current,
                "checkpoint": checkpoint,
                "run": checkpoint.run if checkpoint else None,
            }
        )
        current = checkpoint.run.model_version if checkpoint else None
    return chain


# --- launch ---------------------------------------------------------------------------------


def _resolve_model(team: Team, reference: str) -> ModelVersion:
    slug, number = split_model_reference(reference)
    versions = ModelVersion.objects.filter(
        model__team=team, model__slug=slug, status=VersionStatus.PUBLISHED
    ).select_related("model")
    version = (
        versions.filter(number=number).first() if number else versions.order_by("-number").first()
    )
    if version is None:
        raise LookupError(f"no model {reference!r} in your team")
    return version


def _pin_domain(
    team: Team, entry: dict[str, Any], index: int, errors: dict[str, list[str]]
) -> dict[str, Any] | None:
    path = f"domains[{index}]"
    slug = entry["domain"]
    domain = (
        Domain.objects.filter(team=team, slug=slug)
        .select_related("rubric", "sandbox_image")
        .first()
    )
    if domain is None:
        errors.setdefault(f"{path}.domain", []).append(f"no domain {slug!r} in your team")
        return None
    problems = []
    rubric_version = (
        domain.rubric.versions.filter(status=VersionStatus.PUBLISHED).order_by("-number").first()
        if domain.rubric
        else None
    )
    if domain.rubric is None:
        problems.append(f"domain {slug!r} has no rubric: pick one on the domain's page")
    elif rubric_version is None:
        problems.append(
            f"domain {slug!r} cannot run yet: its rubric {domain.rubric.slug!r} has no "
            "published version (publish one first)"
        )
    image_version = None
    if domain.sandbox_image is not None:
        image_version = (
            domain.sandbox_image.versions.filter(status=VersionStatus.PUBLISHED)
            .order_by("-number")
            .first()
        )
        if image_version is None:
            problems.append(
                f"domain {slug!r} cannot run yet: its sandbox image "
                f"{domain.sandbox_image.slug!r} has no published version"
            )
    if domain.taskset_version == 0 or domain.train_count == 0:
        problems.append(f"domain {slug!r} has no training tasks: upload a task set first")
    if problems:
        errors.setdefault(f"{path}.domain", []).extend(problems)
        return None
    assert rubric_version is not None
    weight = entry.get("weight", domain.default_mix_weight)
    return {
        "domain_id": domain.pk,
        "slug": slug,
        "weight": weight,
        "rubric_id": rubric_version.rubric_id,
        "rubric_version_id": rubric_version.pk,
        "rubric_version": rubric_version.number,
        "rubric_spec": rubric_version.spec,
        "sandbox_image_version_id": image_version.pk if image_version else None,
        "sandbox_image": (
            f"{domain.sandbox_image.slug}@{image_version.number}"
            if image_version and domain.sandbox_image
            else None
        ),
        # What the run's sandboxes start from (tool calls and the rubric's code criteria).
        "sandbox": image_version.sandbox_spec() if image_version else None,
        "taskset_version": domain.taskset_version,
        "held_out_count": domain.tasks.filter(
            taskset_version=domain.taskset_version, split=TaskSplit.HELD_OUT
        ).count(),
    }


def task_file(run: Run, slug: str, split: str) -> str:
    return str(Path(run.work_dir) / "tasks" / f"{slug}.{split}.jsonl")


def training_spec(
    run: Run, document: dict[str, Any], pins: list[dict[str, Any]], model: ModelVersion
) -> dict[str, Any]:
    """The `training.spec.RunSpec` dict of a run: the document with the pinned registry
    objects and the run's own paths filled in."""
    spec = {key: value for key, value in document.items() if key != "domains"}
    spec["base_model"] = model.path
    spec["output_dir"] = run.work_dir
    checkpoint = dict(spec.get("checkpoint") or {})
    checkpoint["dir"] = run.checkpoint_dir  # each attempt saves in its own directory below
    checkpoint["resume"] = "none"  # each attempt sets the run's last recorded checkpoint
    spec["checkpoint"] = checkpoint
    domains = []
    for entry, pin in zip(document["domains"], pins, strict=True):
        domain: dict[str, Any] = {
            "name": pin["slug"],
            "weight": pin["weight"],
            "rubric_spec": pin["rubric_spec"],
            "rubric_version": pin["rubric_version"],
            "task_source": {"kind": "jsonl", "path": task_file(run, pin["slug"], "train")},
            "sandbox_image": pin["sandbox_image"],
        }
        if pin["sandbox"] is not None:
            domain["sandbox"] = pin["sandbox"]
        if pin["held_out_count"]:
            domain["eval_source"] = {
                "kind": "jsonl",
                "path": task_file(run, pin["slug"], "held_out"),
            }
        for key in ("pass_threshold", "max_new_tokens"):
            if key in entry:
                domain[key] = entry[key]
        domains.append(domain)
    spec["domains"] = domains
    return spec


def attempt_training_spec(attempt: Attempt) -> dict[str, Any]:
    """The `training.spec.RunSpec` dict an attempt's job runs (every rank builds the same): the
    run's pinned spec, saving in the attempt's own directory, resuming from the checkpoint the
    attempt was given (the run's newest one in the database), and pruning nothing itself.

    Why a directory per attempt: a stale attempt's job (lost, still running until its next
    step's poll) has its database writes refused, but its saves would land in a shared
    directory, replace the current attempt's checkpoint of the same step and prune its newer
    ones as an "abandoned timeline". The alternative, saving into staging and having the sink
    rename into place under the attempt's lock, would tie a rename and a commit that cannot be
    atomic together, keep the loop waiting on the sink's queue at every save, and still need
    staging names per attempt. In its own directory no save of one attempt can touch another's,
    the database alone says which checkpoint a run resumes from, and what is pruned is decided
    once the database has accepted what supersedes it (`console.runs.sink.checkpoints_prune`),
    by the current attempt's sink only: so the library's own pruning is off here."""
    data = dict(attempt.run.spec)
    data["checkpoint"] = {
        **data.get("checkpoint", {}),
        "dir": attempt.checkpoint_dir,
        "resume": attempt.resume_from or "none",
        "prune": False,
    }
    return data


def _spec_errors(spec: dict[str, Any]) -> dict[str, list[str]]:
    from training.spec import RunSpec, SpecError

    try:
        RunSpec.from_dict(spec)
    except SpecError as error:
        errors: dict[str, list[str]] = {}
        for line in error.errors:
            path, _, message = line.partition(": ")
            if not message:
                path, message = "", line
            # The console's own paths: a domain's pinned fields read as the domain entry.
            path = path.replace(".rubric_spec", ".domain (its published rubric)")
            errors.setdefault(path, []).append(message)
        return errors
    return {}


def run_launch(
    *,
    actor: Any,
    team: Team,
    document: Any,
    gpus: int = 0,
    cpu_slots: int = 1,
    hosts: int = 1,
    priority_class: str = "",
    priority: int = 0,
) -> Run:
    """Validates the launch document in full, pins the registry, saves the run as queued and
    asks the control worker to place it. `priority_class` names a class ("" the default one);
    `priority` orders runs within it. `hosts` > 1 starts the run on that many hosts at once
    (a gang: `gpus` or `cpu_slots` on each, one process group per host). Raises `LaunchError`
    (every problem by path) and then saves nothing."""
    from console.scheduling.models import PriorityClass
    from console.scheduling.services import default_class

    errors = check_document_shape(document)
    if gpus < 0 or gpus > 64:
        errors.setdefault("gpus", []).append("must be between 0 and 64")
    if cpu_slots < 1 or cpu_slots > 64:
        errors.setdefault("cpu_slots", []).append("must be between 1 and 64")
    if hosts < 1 or hosts > 64:
        errors.setdefault("hosts", []).append("must be between 1 and 64")
    if not -1000 <= priority <= 1000:
        errors.setdefault("priority", []).append("must be between -1000 and 1000")
    chosen_class = (
        PriorityClass.objects.filter(name=priority_class).first()
        if priority_class
        else default_class()
    )
    if chosen_class is None:
        names = ", ".join(PriorityClass.objects.values_list("name", flat=True))
        errors.setdefault("priority_class", []).append(
            f"no priority class {priority_class!r} (there are: {names})"
        )
    if errors:
        raise LaunchError(errors)
    model: ModelVersion | None = None
    try:
        model = _resolve_model(team, document["base_model"])
    except (LookupError, ValueError) as error:
        errors.setdefault("base_model", []).append(str(error))
    pins = [_pin_domain(team, entry, i, errors) for i, entry in enumerate(document["domains"])]
    if errors:
        raise LaunchError(errors)
    assert model is not None
    resolved = [p for p in pins if p is not None]
    with transaction.atomic():
        run = Run.objects.create(
            team=team,
            created_by=actor,
            name=document["name"],
            request=document,
            spec={},
            pins={
                "domains": [{k: v for k, v in p.items() if k != "rubric_spec"} for p in resolved],
                "model_version_id": model.pk,
                "model": str(model),
            },
            model_version=model,
            gpus=gpus,
            cpu_slots=cpu_slots,
            hosts=hosts,
            priority_class=chosen_class,
            priority=priority,
            max_steps=0,
            queued_at=timezone.now(),
        )
        run.directory = str(settings.RUNS_ROOT / f"run-{run.pk}-{secrets.token_hex(4)}")
        run.save(update_fields=["directory"])
        spec = training_spec(run, document, resolved, model)
        spec_errors = _spec_errors(spec)
        if spec_errors:
            transaction.set_rollback(True)
            raise LaunchError(spec_errors)
        run.spec = spec
        run.max_steps = int(spec.get("max_steps", 10))
        run.save(update_fields=["spec", "max_steps"])
        record_event(
            run,
            "run.queued",
            {
                "by": actor.get_username(),
                "model": str(model),
                "priority_class": chosen_class.name if chosen_class else "",
                "priority": priority,
                "hosts": hosts,
            },
        )
        audit_record(
            actor=actor,
            team=team,
            action="run.launch",
            target=run,
            before=None,
            after={
                "name": run.name,
                "request": document,
                "pins": run.pins,
                "priority_class": chosen_class.name if chosen_class else "",
                "priority": priority,
            },
        )
        notify(run, "run.created", {"state": run.state})
        transaction.on_commit(request_placement)
    return run


def request_placement() -> None:
    from console.runs.tasks import place_runs

    try:
        place_runs.delay()
    except Exception:  # the periodic sweep places it anyway; the launch itself succeeded
        logger.exception("could not ask the control worker to place runs")


# --- placement ------------------------------------------------------------------------------


def _fresh_host_cutoff() -> dt.datetime:
    return timezone.now() - dt.timedelta(seconds=settings.HOST_OFFLINE_AFTER_S)


def host_free_slots(host: Host) -> tuple[int, int]:
    """(free GPU slots, free CPU slots) on `host` (every node of a live attempt placed there)."""
    live = Allocation.objects.filter(host=host, attempt__state__in=LIVE_ATTEMPT_STATES)
    gpus = sum(a.gpus for a in live)
    cpus = sum(a.cpu_slots for a in live)
    return host.gpu_slots - gpus, host.cpu_slots - cpus


def last_checkpoint(run: Run) -> Checkpoint | None:
    """The newest checkpoint the database has a record of: its trajectories were all committed
    before it (the sink writes in the order the run produced them)."""
    return run.checkpoints.order_by("-step", "-id").first()


def place_runs() -> list[Attempt]:
    """One pass of the scheduler (`console.scheduling.services.schedule_pass`: priority
    classes, quotas, gangs, preemption requests). Returns the attempts made; their messages go
    out after commit. Nothing when another pass holds the scheduler's lock."""
    from console.scheduling.services import schedule_pass

    return schedule_pass().placed


def allocations_create(*, attempt: Attempt, hosts: list[Host]) -> list[Allocation]:
    """The attempt's share of each host (node k on ``hosts[k]``, node 0 on its own host), each
    taking the run's GPUs or, without GPUs, its CPU slots: what the scheduler counts in use.
    Every attempt has them (the scheduler's `_schedule` makes them with the attempt)."""
    run = attempt.run
    return Allocation.objects.bulk_create(
        Allocation(
            attempt=attempt,
            run=run,
            host=host,
            node_rank=node,
            gpus=run.gpus,
            cpu_slots=0 if run.gpus else run.cpu_slots,
        )
        for node, host in enumerate(hosts)
    )


def _schedule(run: Run, hosts: list[Host], *, rendezvous_port: int | None = None) -> Attempt:
    """The run's next attempt on `hosts` (node 0 first): one allocation per host, and one
    message to each host's queue after commit. A run on several hosts (a gang) needs its
    `rendezvous_port` on node 0's host. Its one caller (`gang_start`, in
    console.scheduling.services) has checked the hosts (as many as the run needs, distinct,
    each with room) and taken the port, in the same transaction."""
    number = (run.attempts.aggregate(n=Max("number"))["n"] or 0) + 1
    checkpoint = last_checkpoint(run)
    master = hosts[0]
    gang = len(hosts) > 1
    attempt = Attempt.objects.create(
        run=run,
        number=number,
        host=master,
        resume_from=checkpoint.path if checkpoint else "",
        start_step=checkpoint.step if checkpoint else 0,
        rendezvous=f"{master.address or '127.0.0.1'}:{rendezvous_port}" if gang else "",
        rendezvous_port=rendezvous_port if gang else None,
    )
    allocations_create(attempt=attempt, hosts=hosts)
    names = [h.name for h in hosts]
    where = f"{len(hosts)} hosts ({', '.join(names)})" if gang else master.name
    _set_run_state(run, RunState.SCHEDULED, f"placed on {where} (attempt {number})")
    data: dict[str, Any] = {"attempt": number, "host": master.name, "step": attempt.start_step}
    if gang:
        data.update(hosts=names, rendezvous=attempt.rendezvous)
    record_event(run, "attempt.scheduled", data, attempt=attempt)

    def send() -> None:
        from console.runs.tasks import execute_attempt

        for node, host in enumerate(hosts):
            execute_attempt.apply_async(args=[attempt.pk], kwargs={"node": node}, queue=host.queue)

    transaction.on_commit(send)
    return attempt


# --- the attempt lifecycle (host agent and job) ---------------------------------------------


def attempt_claim(*, attempt_id: int, host_name: str, pid: int, node: int = 0) -> bool:
    """The host agent takes its node of the attempt: conditional updates, so a re-delivered
    message (or a second agent) never runs a node twice. Node 0 also takes the attempt itself
    (its job's rank 0 reports for the run); the other nodes only their allocation, while the
    attempt is live."""
    now = timezone.now()
    with transaction.atomic():
        if node == 0:
            claimed = Attempt.objects.filter(
                pk=attempt_id, state=AttemptState.SCHEDULED, host__name=host_name
            ).update(state=AttemptState.STARTING, started_at=now, heartbeat_at=now, pid=pid)
            if claimed != 1:
                return False
        elif not Attempt.objects.filter(pk=attempt_id, state__in=LIVE_ATTEMPT_STATES).exists():
            return False
        taken = Allocation.objects.filter(
            attempt_id=attempt_id,
            node_rank=node,
            host__name=host_name,
            state=AllocationState.SCHEDULED,
        ).update(state=AllocationState.STARTING, started_at=now)
        if node != 0 and taken != 1:
            return False
    return True


def node_started(*, attempt: Attempt, node: int, pid: int, command: list[str]) -> None:
    """A node's process group runs (recorded on the run as ``node.started``)."""
    _node_changed(
        attempt,
        node,
        "node.started",
        {"state": AllocationState.RUNNING, "pid": pid},
        {"pid": pid, "command": " ".join(command)[:1000]},
    )


def node_exited(*, attempt: Attempt, node: int, exit_code: int | None) -> None:
    """A node's process group ended (``node.exited``); node 0's exit code is the attempt's."""
    if node == 0:
        Attempt.objects.filter(pk=attempt.pk).update(exit_code=exit_code)
    _node_changed(
        attempt,
        node,
        "node.exited",
        {"state": AllocationState.EXITED, "exit_code": exit_code, "ended_at": timezone.now()},
        {"exit_code": exit_code},
    )
    notify(attempt.run, "run.event", {"kind": "node.exited"}, to_lists=False)


def _node_changed(
    attempt: Attempt, node: int, kind: str, changes: dict[str, Any], data: dict[str, Any]
) -> None:
    """Writes `changes` on the node's allocation and records `kind` on the run with `data`."""
    allocation = Allocation.objects.select_related("host").get(attempt=attempt, node_rank=node)
    Allocation.objects.filter(pk=allocation.pk).update(**changes)
    data = {"attempt": attempt.number, "node": node, "host": allocation.host.name, **data}
    record_event(attempt.run, kind, data, attempt=attempt)


def node_never_started(*, attempt_id: int, node: int) -> None:
    """The agent claimed the node but started no process (it could not write the run's task
    files): the node holds nothing."""
    Allocation.objects.filter(
        attempt_id=attempt_id, node_rank=node, state=AllocationState.STARTING
    ).update(state=AllocationState.LOST, ended_at=timezone.now())


def gang_stop_reason(attempt_id: int) -> str:
    """Why a node of a gang should stop its process group now ("" if it should not): the
    attempt ended without it (another node died, its host went silent, the run failed), or it
    ended well (completed, preempted) more than RUN_CANCEL_GRACE_S ago and this node still
    runs. Every node runs only while all do: ranks alone cannot finish a step."""
    attempt = Attempt.objects.only("state", "outcome", "ended_at").get(pk=attempt_id)
    if attempt.state in LIVE_ATTEMPT_STATES:
        return ""
    grace = dt.timedelta(seconds=settings.RUN_CANCEL_GRACE_S)
    if attempt.outcome in ("completed", "preempted") and (
        attempt.ended_at is None or timezone.now() - attempt.ended_at < grace
    ):
        return ""
    return f"the attempt has ended ({attempt.outcome or attempt.state})"


def gang_peer_lost(*, attempt: Attempt, node: int, wait_s: float) -> str:
    """For rank 0 of a gang whose training failed: whether another node died (or its host went
    silent) within `wait_s`. A node's death breaks the collective and fails every rank, so
    the failure is that node's death (the run resumes), not the run's. "" when every other node
    exited cleanly, or none died within `wait_s`."""
    deadline = time.monotonic() + wait_s
    silent_after = dt.timedelta(seconds=settings.HOST_OFFLINE_AFTER_S)
    while True:
        state, outcome = Attempt.objects.values_list("state", "outcome").get(pk=attempt.pk)
        if state not in LIVE_ATTEMPT_STATES:
            return f"the attempt already ended ({outcome or state})"
        peers = list(
            Allocation.objects.filter(attempt_id=attempt.pk)
            .exclude(node_rank=node)
            .select_related("host")
        )
        for peer in peers:
            if peer.state == AllocationState.LOST or (
                peer.state == AllocationState.EXITED and peer.exit_code not in (0, None)
            ):
                return f"node {peer.node_rank} on {peer.host.name} died (exit {peer.exit_code})"
            beat = peer.host.heartbeat_at
            if beat is None or timezone.now() - beat > silent_after:
                return f"node {peer.node_rank}'s host {peer.host.name} went silent"
        if all(p.state == AllocationState.EXITED for p in peers) or time.monotonic() > deadline:
            return ""
        time.sleep(0.5)


def attempt_started(attempt: Attempt, *, pid: int) -> None:
    with transaction.atomic():
        updated = Attempt.objects.filter(pk=attempt.pk, state=AttemptState.STARTING).update(
            state=AttemptState.RUNNING, pid=pid, heartbeat_at=timezone.now()
        )
        if not updated:
            return
        run = Run.objects.select_for_update().get(pk=attempt.run_id)
        if run.state == RunState.SCHEDULED:
            _set_run_state(
                run,
                RunState.RUNNING,
                f"running on {attempt.host.name} (attempt {attempt.number})",
                started_at=run.started_at or timezone.now(),
            )


def attempt_heartbeat(attempt_ids: list[int]) -> None:
    if attempt_ids:
        Attempt.objects.filter(pk__in=attempt_ids, state__in=LIVE_ATTEMPT_STATES).update(
            heartbeat_at=timezone.now()
        )


def attempt_append_log(attempt_id: int, text: str) -> None:
    """Adds job output to the attempt's log: the first 64 KiB are kept as the head, then the
    newest RUN_LOG_MAX_BYTES as the tail (older middle output is counted and left out)."""
    if not text:
        return
    head_max = 64 * 1024
    tail_max = settings.RUN_LOG_MAX_BYTES
    with transaction.atomic():
        attempt = (
            Attempt.objects.select_for_update()
            .only("log_head", "log_tail", "log_bytes")
            .get(pk=attempt_id)
        )
        attempt.log_bytes += len(text.encode())
        room = head_max - len(attempt.log_head)
        if room > 0 and not attempt.log_tail:
            attempt.log_head += text[:room]
            text = text[room:]
        if text:
            tail = attempt.log_tail + text
            if len(tail) > tail_max:
                tail = tail[-tail_max:]
            attempt.log_tail = tail
        attempt.save(update_fields=["log_head", "log_tail", "log_bytes"])


_OUTCOME_STATES = {
    "completed": (AttemptState.COMPLETED, RunState.COMPLETED),
    "failed": (AttemptState.FAILED, RunState.FAILED),
    "cancelled": (AttemptState.CANCELLED, RunState.CANCELLED),
    "preempted": (AttemptState.PREEMPTED, RunState.QUEUED),
}


def attempt_finished(
    *, attempt_id: int, status: str, step: int, error: str = "", exit_code: int | None = None
) -> bool:
    """Records how an attempt ended and moves its run on: completed, failed and cancelled are
    final; a preempted run goes back to the queue and resumes from its checkpoint. False when
    the attempt had already ended (the job and the agent both report; the first one wins)."""
    attempt_state, run_state = _OUTCOME_STATES[status]
    with transaction.atomic():
        attempt = Attempt.objects.select_for_update().select_related("host").get(pk=attempt_id)
        if attempt.state not in LIVE_ATTEMPT_STATES:
            return False
        attempt.state = attempt_state
        attempt.outcome = status
        attempt.error = error[:20000]
        attempt.ended_at = timezone.now()
        if exit_code is not None:
            attempt.exit_code = exit_code
        attempt.save(update_fields=["state", "outcome", "error", "ended_at", "exit_code"])
        # A node no agent has claimed yet never will (its claim needs a live attempt).
        Allocation.objects.filter(attempt=attempt, state=AllocationState.SCHEDULED).update(
            state=AllocationState.LOST, ended_at=attempt.ended_at
        )
        run = Run.objects.select_for_update().get(pk=attempt.run_id)
        record_event(
            run,
            f"attempt.{status}",
            {"attempt": attempt.number, "step": step, "error": error[:2000]},
            attempt=attempt,
        )
        fields: dict[str, Any] = {}
        if run_state in (RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED):
            fields["ended_at"] = timezone.now()
        if status == "failed":
            fields["error"] = error[:20000]
            first_line = error.splitlines()[0] if error else "no error text"
            reason = f"failed on {attempt.host.name} at step {step}: {first_line}"
        elif status == "preempted":
            reason = f"preempted at step {step}; resumes from its checkpoint"
        else:
            reason = f"{status} at step {step}"
        if run.state == RunState.CANCELLED:
            run_state = RunState.CANCELLED  # cancelled while queued-back: stays cancelled
        _set_run_state(run, run_state, reason, **fields)
        if run_state == RunState.QUEUED:
            transaction.on_commit(request_placement)
    return True


def _requeue_lost(attempt: Attempt, reason: str, outcome: str = "lost") -> None:
    attempt.state = AttemptState.LOST
    attempt.outcome = outcome
    attempt.error = reason
    attempt.ended_at = timezone.now()
    attempt.save(update_fields=["state", "outcome", "error", "ended_at"])
    # Nodes that never started will not: their hosts' agents find nothing to claim. Nodes on a
    # silent host never report their exit. (Running nodes elsewhere are stopped by their
    # agents, which record their exit: `gang_stop_reason`.)
    Allocation.objects.filter(attempt=attempt).filter(
        Q(state=AllocationState.SCHEDULED) | Q(host__state=HostState.OFFLINE)
    ).exclude(state=AllocationState.EXITED).update(
        state=AllocationState.LOST, ended_at=timezone.now()
    )
    run = Run.objects.select_for_update().get(pk=attempt.run_id)
    record_event(
        run, "attempt.lost", {"attempt": attempt.number, "reason": reason}, attempt=attempt
    )
    if run.is_terminal:
        return
    if run.commands.filter(kind=CommandKind.CANCEL).exists():
        _set_run_state(run, RunState.CANCELLED, f"cancelled ({reason})", ended_at=timezone.now())
    else:
        _set_run_state(run, RunState.QUEUED, f"{reason}; resumes from its last checkpoint")


def attempt_died(
    *, attempt_id: int, exit_code: int | None, last_output: str, where: str = ""
) -> None:
    """The job exited without reporting an outcome (killed by a signal or the OOM killer, or
    its interpreter crashed), or, in a gang, one node's process group did (`where` names it):
    the whole attempt ends. Its run goes back to the queue and resumes from its last
    checkpoint, unless its jobs have now died RUN_MAX_ATTEMPTS times: then it fails, with the
    job's last output."""
    how = f"signal {-exit_code}" if exit_code is not None and exit_code < 0 else f"code {exit_code}"
    reason = f"the job{where} died ({how}) without reporting"
    with transaction.atomic():
        attempt = Attempt.objects.select_for_update().get(pk=attempt_id)
        if attempt.state not in LIVE_ATTEMPT_STATES:
            return
        deaths = Attempt.objects.filter(run_id=attempt.run_id, outcome="died").count() + 1
        if deaths < settings.RUN_MAX_ATTEMPTS:
            attempt.exit_code = exit_code
            attempt.save(update_fields=["exit_code"])
            _requeue_lost(attempt, reason, outcome="died")
            transaction.on_commit(request_placement)
            return
    attempt_finished(
        attempt_id=attempt_id,
        status="failed",
        step=attempt.start_step,
        exit_code=exit_code,
        error=f"{reason}, {deaths} times; its last output:\n{last_output}",
    )


def sweep() -> dict[str, int]:
    """What the control worker does every few seconds: hosts whose heartbeat stopped go
    offline and their attempts back to the queue; attempts no agent took or that stopped
    beating are re-queued; then queued runs are placed."""
    cutoff = _fresh_host_cutoff()
    lost = 0
    with transaction.atomic():
        silent = Host.objects.select_for_update(skip_locked=True).filter(
            ~Q(state=HostState.OFFLINE), Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at=None)
        )
        for host in silent:
            host.state = HostState.OFFLINE
            host.state_reason = (
                f"no heartbeat for {settings.HOST_OFFLINE_AFTER_S} s (last "
                f"{host.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC)"
                if host.heartbeat_at
                else "never sent a heartbeat"
            )
            host.save(update_fields=["state", "state_reason"])
        if silent:  # the fleet page shows them offline: ring it (not on every heartbeat)
            _fleet_hosts_changed()
        # A gang is lost with any of its hosts.
        gang_offline = Allocation.objects.filter(
            host__state=HostState.OFFLINE, attempt__state__in=LIVE_ATTEMPT_STATES
        ).values("attempt_id")
        # A node no agent claimed in time (a gang's other nodes keep the attempt's heartbeat
        # fresh, so that alone does not show it).
        unclaimed = Allocation.objects.filter(
            state=AllocationState.SCHEDULED,
            attempt__state__in=LIVE_ATTEMPT_STATES,
            attempt__scheduled_at__lt=cutoff,
        ).values("attempt_id")
        stale = (
            Attempt.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(state__in=LIVE_ATTEMPT_STATES)
            .filter(
                Q(host__state=HostState.OFFLINE)
                | Q(pk__in=gang_offline)
                | Q(pk__in=unclaimed)
                | Q(heartbeat_at__lt=cutoff)
                | Q(heartbeat_at=None, scheduled_at__lt=cutoff)
            )
            .select_related("host")
        )
        for attempt in stale:
            gone = (
                Allocation.objects.filter(attempt=attempt, host__state=HostState.OFFLINE)
                .values_list("host__name", flat=True)
                .first()
            )
            waiting = (
                Allocation.objects.filter(attempt=attempt, state=AllocationState.SCHEDULED)
                .values_list("host__name", flat=True)
                .first()
            )
            if gone:
                reason = f"host {gone} went silent"
            elif waiting and attempt.scheduled_at < cutoff:
                reason = f"host {waiting} did not start its part of attempt {attempt.number}"
            else:
                reason = f"attempt {attempt.number} stopped reporting on {attempt.host.name}"
            _requeue_lost(attempt, reason)
            lost += 1
    placed = place_runs()
    return {"lost": lost, "placed": len(placed)}


# --- hosts ----------------------------------------------------------------------------------


def host_register(*, name: str, inventory: dict[str, Any], agent_pid: int) -> Host:
    gpus = len(inventory.get("gpus") or [])
    host, _ = Host.objects.update_or_create(
        name=name,
        defaults={
            "inventory": inventory,
            "gpu_slots": gpus,
            "cpu_slots": 0 if gpus else settings.HOST_CPU_SLOTS,
            "address": settings.HOST_ADDRESS,
            "agent_pid": agent_pid,
            "heartbeat_at": timezone.now(),
        },
    )
    Host.objects.filter(pk=host.pk, state=HostState.OFFLINE).update(
        state=HostState.READY, state_reason="agent started"
    )
    host.refresh_from_db()
    _fleet_hosts_changed()  # a new host, or one online again
    _forget_dead_nodes(host)
    if host.pool_id is None:
        from console.scheduling.services import default_pool

        Host.objects.filter(pk=host.pk).update(pool=default_pool())
        host.refresh_from_db()
    transaction.on_commit(request_placement)  # the fleet changed
    return host


def _forget_dead_nodes(host: Host) -> None:
    """An agent that starts runs nothing yet: whatever its host's nodes were running died with
    the previous agent (``PR_SET_PDEATHSIG``). Those nodes are lost, and so are their live
    attempts (a gang's other nodes would otherwise wait on a peer that is gone)."""
    with transaction.atomic():
        dead = list(
            Allocation.objects.select_for_update()
            .filter(host=host, state__in=[AllocationState.STARTING, AllocationState.RUNNING])
            .select_related("attempt")
        )
        if not dead:
            return
        Allocation.objects.filter(pk__in=[n.pk for n in dead]).update(
            state=AllocationState.LOST, ended_at=timezone.now()
        )
        live = {n.attempt_id for n in dead if n.attempt.state in LIVE_ATTEMPT_STATES}
        for attempt in Attempt.objects.select_for_update().filter(
            pk__in=live, state__in=LIVE_ATTEMPT_STATES
        ):
            _requeue_lost(attempt, f"the host agent on {host.name} restarted")
        if live:
            transaction.on_commit(request_placement)


def _fleet_hosts_changed() -> None:
    from console.scheduling.services import hosts_changed

    hosts_changed()


def host_heartbeat(*, name: str, attempt_ids: list[int]) -> None:
    now = timezone.now()
    # a beat after a silence the page already shows ("silent", before the sweep marks the
    # host offline) rings it too; the other beats ring nothing
    mine = Host.objects.filter(name=name)
    stale = Q(heartbeat_at__lt=_fresh_host_cutoff()) | Q(heartbeat_at=None)
    was_silent = mine.filter(stale).update(heartbeat_at=now) > 0
    if not was_silent:
        mine.update(heartbeat_at=now)
    back = Host.objects.filter(name=name, state=HostState.OFFLINE).update(
        state=HostState.READY, state_reason="heartbeat back"
    )
    if back:
        transaction.on_commit(request_placement)  # the fleet changed
    if back or was_silent:
        _fleet_hosts_changed()  # online again on the fleet page
    attempt_heartbeat(attempt_ids)


def host_set_state(*, actor: Any, host: Host, state: str, reason: str) -> Host:
    host.state = state
    host.state_reason = reason
    host.save(update_fields=["state", "state_reason"])
    return host


# --- operator commands ----------------------------------------------------------------------


def run_command(
    *, actor: Any, run: Run, kind: str, payload: dict[str, Any] | None = None, reason: str = ""
) -> RunCommand | None:
    """Cancel, preempt or override. A queued run is cancelled at once (no command: nothing runs
    it); a finished run refuses every command (ValueError)."""
    from django.core.exceptions import ValidationError

    payload = payload or {}
    if kind == CommandKind.OVERRIDES:
        from training.control import Overrides

        try:
            overrides = Overrides.from_dict(payload)
        except ValueError as error:
            raise ValidationError({"overrides": [str(error)]}) from None
        if overrides.is_empty():
            raise ValidationError({"overrides": ["nothing to change"]})
        names = {d["slug"] for d in run.pins.get("domains", [])}
        unknown = sorted(set(overrides.domain_weights or {}) - names)
        if unknown:
            raise ValidationError(
                {"domain_weights": [f"not a domain of this run: {', '.join(unknown)}"]}
            )
        payload = overrides.to_dict()
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.is_terminal:
            raise ValueError(f"the run has already {run.state}")
        before = {"state": run.state}
        command = None
        if kind == CommandKind.CANCEL and run.state in (RunState.QUEUED, RunState.PREEMPTED):
            _set_run_state(
                run, RunState.CANCELLED, reason or "cancelled while queued", ended_at=timezone.now()
            )
        elif kind == CommandKind.PREEMPT and run.state in (RunState.QUEUED, RunState.PREEMPTED):
            raise ValueError("the run is not running: there is nothing to preempt")
        else:
            command = RunCommand.objects.create(
                run=run, kind=kind, payload=payload, reason=reason, created_by=actor
            )
            record_event(
                run,
                f"control.{kind}_requested",
                {
                    "command": command.pk,
                    "payload": payload,
                    "reason": reason,
                    "by": actor.get_username() if actor else "scheduler",
                },
            )
            if kind == CommandKind.PREEMPT:
                _set_run_state(run, RunState.PREEMPTING, reason or "preemption requested")
        audit_record(
            actor=actor,
            team=run.team,
            action=f"run.{kind}",
            target=run,
            before=before,
            after={"state": run.state, "payload": payload, "reason": reason},
        )
    return command


def commands_deliver(*, attempt: Attempt, step: int) -> list[RunCommand]:
    """The run's undelivered commands, marked delivered to `attempt` at `step` (each once).
    Raises `AttemptNotCurrent` for an attempt that is no longer live: its commands are the
    current attempt's."""
    with transaction.atomic():
        attempt_hold_current(attempt)
        commands = list(
            RunCommand.objects.select_for_update(skip_locked=True)
            .filter(run_id=attempt.run_id, delivered_at=None)
            .order_by("id")
        )
        if commands:
            RunCommand.objects.filter(pk__in=[c.pk for c in commands]).update(
                delivered_at=timezone.now(), delivered_step=step, delivered_to=attempt
            )
            run = Run.objects.get(pk=attempt.run_id)
            for command in commands:
                record_event(
                    run,
                    "control.delivered",
                    {
                        "command": command.pk,
                        "kind": command.kind,
                        "step": step,
                        "payload": command.payload,
                    },
                    attempt=attempt,
                )
    return commands
