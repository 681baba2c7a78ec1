"""Reads for the trajectory explorer: a run's trajectories filtered and paged by a keyset
cursor, one GRPO group with its (recomputed) advantages, one sample laid out for its page, and
the same task's other samples across policy versions.

Callers check the team (console.accounts.access) first. Everything taken from a trajectory is
model output: the templates show it escaped, never marked safe.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from django.db.models import (
    Case,
    CharField,
    F,
    FloatField,
    Func,
    IntegerField,
    Q,
    QuerySet,
    Value,
    When,
)
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Cast, Coalesce, Left

from console.runs.models import Run, TrajectoryRecord
from training.trajectory import DISCARD_REASONS

PAGE_SIZE = 50
COMPLETION_CHARS = 160
SAME_TASK_ROWS = 200
# The group-relative advantage as the loop's "grpo" estimator computes it
# (training.algorithms: unbiased group std; a group of one is centred on 0 with std 1).
ADVANTAGE_EPSILON = 1e-6
FINISH_REASONS = ("stop", "length")
TOOL_CHOICES = ("with", "without")
# The "discarded" filter: any reason, trained-on samples only, or one reason.
DISCARD_CHOICES = ("yes", "no", *DISCARD_REASONS)
DISCARD_LABELS = {
    "zero_variance": "zero variance (the group's rewards were all equal)",
    "batch_full": "batch full (dynamic sampling drew more varied groups than it trains on)",
}


# --- filters --------------------------------------------------------------------------------


def _int(text: str | None) -> int | None:
    try:
        value = int(str(text).strip())
    except (TypeError, ValueError):
        return None
    return value if value >= 0 else None


def _float(text: str | None) -> float | None:
    try:
        value = float(str(text).strip())
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class Filters:
    """What the list shows; a value that does not parse is left out (and named in
    ``ignored``), so a hand-edited URL still shows a page."""

    step: int | None = None
    domain: str = ""
    min_reward: float | None = None
    max_reward: float | None = None
    finish: str = ""
    tools: str = ""  # "with" | "without" | "" (either)
    criterion: str = ""
    criterion_min: float | None = None
    discarded: str = ""  # DISCARD_CHOICES, or "" (trained on or not)
    ignored: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_query(cls, query: Any) -> Filters:
        ignored: list[str] = []

        def number(name: str, parse: Any) -> Any:
            text = (query.get(name) or "").strip()
            if not text:
                return None
            value = parse(text)
            if value is None:
                ignored.append(name)
            return value

        finish = (query.get("finish") or "").strip()
        if finish and finish not in FINISH_REASONS:
            ignored.append("finish")
            finish = ""
        tools = (query.get("tools") or "").strip()
        if tools and tools not in TOOL_CHOICES:
            ignored.append("tools")
            tools = ""
        discarded = (query.get("discarded") or "").strip()
        if discarded and discarded not in DISCARD_CHOICES:
            ignored.append("discarded")
            discarded = ""
        return cls(
            step=number("step", _int),
            domain=(query.get("domain") or "").strip()[:64],
            min_reward=number("min_reward", _float),
            max_reward=number("max_reward", _float),
            finish=finish,
            tools=tools,
            criterion=(query.get("criterion") or "").strip()[:200],
            criterion_min=number("criterion_min", _float),
            discarded=discarded,
            ignored=tuple(ignored),
        )

    def params(self) -> dict[str, str]:
        """The filters as query parameters (those set), for links that keep them."""
        values = {
            "step": self.step,
            "domain": self.domain,
            "min_reward": self.min_reward,
            "max_reward": self.max_reward,
            "finish": self.finish,
            "tools": self.tools,
            "criterion": self.criterion,
            "criterion_min": self.criterion_min,
            "discarded": self.discarded,
        }
        return {k: str(v) for k, v in values.items() if v is not None and v != ""}

    def query(self, **extra: str) -> str:
        return urlencode({**self.params(), **extra})

    @property
    def active(self) -> bool:
        return bool(self.params())


def _breakdown_score(criterion: str) -> KeyTransform:
    # KeyTransform quotes the key as a parameter: any criterion name is safe here, "__" too.
    return KeyTransform(criterion, KeyTransform("breakdown", KeyTransform("reward", "data")))


def _tool_calls() -> Coalesce:
    return Coalesce(
        Func(
            KeyTransform("observations", "data"),
            function="jsonb_array_length",
            output_field=IntegerField(),
        ),
        Value(0),
    )


def filtered(run: Run, filters: Filters) -> QuerySet[TrajectoryRecord]:
    rows = TrajectoryRecord.objects.filter(run=run)
    if filters.step is not None:
        rows = rows.filter(step=filters.step)
    if filters.domain:
        rows = rows.filter(domain=filters.domain)
    if filters.min_reward is not None:
        rows = rows.filter(reward__gte=filters.min_reward)
    if filters.max_reward is not None:
        rows = rows.filter(reward__lte=filters.max_reward)
    if filters.finish:
        rows = rows.filter(finish_reason=filters.finish)
    if filters.discarded == "yes":
        rows = rows.exclude(discarded="")
    elif filters.discarded == "no":
        rows = rows.filter(discarded="")
    elif filters.discarded:
        rows = rows.filter(discarded=filters.discarded)
    if filters.tools:
        rows = rows.alias(tool_count=_tool_calls())
        rows = (
            rows.filter(tool_count__gt=0) if filters.tools == "with" else rows.filter(tool_count=0)
        )
    if filters.criterion:
        # Only numeric scores are cast (the CASE guards the cast): no row can make it fail.
        text = KeyTextTransform(
            filters.criterion, KeyTransform("breakdown", KeyTransform("reward", "data"))
        )
        rows = rows.alias(
            criterion_type=Func(
                _breakdown_score(filters.criterion),
                function="jsonb_typeof",
                output_field=CharField(),
            )
        ).alias(
            criterion_score=Case(
                When(criterion_type="number", then=Cast(text, FloatField())),
                default=None,
                output_field=FloatField(),
            )
        )
        rows = rows.filter(criterion_score__isnull=False)
        if filters.criterion_min is not None:
            rows = rows.filter(criterion_score__gte=filters.criterion_min)
    return rows


# --- the list, keyset-paged -----------------------------------------------------------------


def parse_cursor(text: str | None) -> tuple[int, int] | None:
    """``"<step>-<index>"`` → (step, index); anything else → None (the first page)."""
    if not text:
        return None
    step, _, index = str(text).partition("-")
    parsed = _int(step), _int(index)
    if parsed[0] is None or parsed[1] is None:
        return None
    return parsed[0], parsed[1]


@dataclass
class Page:
    rows: Sequence[TrajectoryRecord]
    next_cursor: str | None  # "<step>-<index>" of the last row, when more follow
    first: bool


def trajectory_page(
    run: Run, filters: Filters, *, after: tuple[int, int] | None = None, limit: int = PAGE_SIZE
) -> Page:
    """Newest steps first, in index order within a step; the page after the cursor ``after``
    = (step, index) of the previous page's last row. Each row has ``group``, ``tool_calls``
    and ``completion_head`` (the full trajectory is not read)."""
    rows = filtered(run, filters)
    if after is not None:
        rows = rows.filter(Q(step__lt=after[0]) | Q(step=after[0], index__gt=after[1]))
    rows = (
        rows.defer("data")
        .annotate(
            group=KeyTextTransform("group", KeyTransform("provenance", "data")),
            tool_calls=_tool_calls(),
            completion_head=Left(KeyTextTransform("completion", "data"), COMPLETION_CHARS + 1),
            attempt_number=F("attempt__number"),
        )
        .order_by("-step", "index")
    )
    found = list(rows[: limit + 1])
    more = len(found) > limit
    found = found[:limit]
    last = found[-1] if found else None
    return Page(
        rows=found,
        next_cursor=f"{last.step}-{last.index}" if more and last is not None else None,
        first=after is None,
    )


def run_domains(run: Run) -> list[str]:
    pinned = [entry.get("slug", "") for entry in run.pins.get("domains", [])]
    return [slug for slug in pinned if slug]


# --- one group ------------------------------------------------------------------------------


def advantages(rewards: list[float]) -> list[float]:
    """(r - mean) / (std + 1e-6) over the group, as the loop's "grpo" estimator: the unbiased
    std; a group of one sample gets mean 0 and std 1."""
    if len(rewards) < 2:
        return [r / (1.0 + ADVANTAGE_EPSILON) for r in rewards]
    mean = statistics.fmean(rewards)
    std = statistics.stdev(rewards)
    return [(r - mean) / (std + ADVANTAGE_EPSILON) for r in rewards]


def group_samples(run: Run, step: int, group: int) -> list[TrajectoryRecord]:
    return list(
        TrajectoryRecord.objects.filter(run=run, step=step)
        .filter(data__provenance__group=group)
        .select_related("attempt")
        .order_by("index")
    )


@dataclass
class Group:
    step: int
    group: int
    samples: list[dict[str, Any]]
    criteria: list[str]
    mean: float | None
    std: float | None
    task_id: str


def group_view(run: Run, step: int, group: int) -> Group | None:
    records = group_samples(run, step, group)
    if not records:
        return None
    rewards = [record.reward for record in records]
    # By name: the stored JSON (jsonb) does not keep the rubric's order.
    criteria = sorted({name for r in records for name in _reward(r.data).get("breakdown") or {}})
    samples = []
    for record, advantage in zip(records, advantages(rewards), strict=True):
        breakdown = _reward(record.data).get("breakdown", {})
        samples.append(
            {
                "record": record,
                "advantage": advantage,
                "scores": [breakdown.get(name) for name in criteria],
                "completion": str(record.data.get("completion", "")),
            }
        )
    return Group(
        step=step,
        group=group,
        samples=samples,
        criteria=criteria,
        mean=statistics.fmean(rewards),
        std=statistics.stdev(rewards) if len(rewards) > 1 else None,
        task_id=records[0].task_id,
    )


# --- one sample -----------------------------------------------------------------------------


def _reward(data: dict[str, Any]) -> dict[str, Any]:
    reward = data.get("reward")
    return reward if isinstance(reward, dict) else {}


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        texts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                texts.append(str(part.get("text", "")))
            else:
                texts.append(pretty(part))
        return "\n".join(texts)
    return pretty(content)


def _arguments(text: Any) -> str:
    if isinstance(text, str):
        try:
            return pretty(json.loads(text))
        except ValueError:
            return text
    return pretty(text)


def chat(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages for the page: role, text, the tool calls an assistant made (name,
    arguments pretty-printed) and, for a tool message, which call it answers."""
    messages = data.get("messages")
    result = []
    for message in messages if isinstance(messages, list) else []:
        if not isinstance(message, dict):
            continue
        calls = []
        for call in message.get("tool_calls") or []:
            function = call.get("function", {}) if isinstance(call, dict) else {}
            calls.append(
                {
                    "id": str(call.get("id", "")) if isinstance(call, dict) else "",
                    "name": str(function.get("name", "")),
                    "arguments": _arguments(function.get("arguments", "")),
                }
            )
        result.append(
            {
                "role": str(message.get("role", "")),
                "text": _content_text(message.get("content")),
                "tool_calls": calls,
                "tool_call_id": str(message.get("tool_call_id") or ""),
                "name": str(message.get("name") or ""),
            }
        )
    return result


def sample_get(run: Run, step: int, index: int) -> TrajectoryRecord:
    """Raises TrajectoryRecord.DoesNotExist."""
    return TrajectoryRecord.objects.select_related("attempt").get(run=run, step=step, index=index)


def rubric_link(run: Run, record: TrajectoryRecord) -> tuple[int, int] | None:
    """(rubric id, version number) when the run's pins name the sample's rubric version."""
    for pin in run.pins.get("domains", []):
        if (
            pin.get("slug") == record.domain
            and pin.get("rubric_id")
            and pin.get("rubric_version") is not None
            and pin.get("rubric_version") == record.rubric_version
        ):
            return int(pin["rubric_id"]), int(pin["rubric_version"])
    return None


def sample_view(run: Run, record: TrajectoryRecord) -> dict[str, Any]:
    data = record.data if isinstance(record.data, dict) else {}
    reward = _reward(data)
    breakdown = reward.get("breakdown") or {}
    details = reward.get("details") or {}
    names = sorted({*breakdown, *details})
    provenance = data.get("provenance") or {}
    observations = [o for o in data.get("observations") or [] if isinstance(o, dict)]
    return {
        "chat_messages": chat(data),  # not "messages": the base template shows those
        "completion": str(data.get("completion", "")),
        "observations": observations,
        "criteria": [
            {
                "name": name,
                "score": breakdown.get(name),
                "details": pretty(details[name]) if name in details else "",
            }
            for name in names
        ],
        "reward_total": reward.get("total", record.reward),
        "provenance": provenance,
        "discarded_label": DISCARD_LABELS.get(record.discarded, record.discarded),
        "group": provenance.get("group"),
        "rubric_link": rubric_link(run, record),
    }


def same_task(run: Run, record: TrajectoryRecord) -> list[dict[str, Any]]:
    """The run's other samples of the same task, oldest step first (what training changed)."""
    if not record.task_id:
        return []
    rows = (
        TrajectoryRecord.objects.filter(run=run, task_id=record.task_id)
        .exclude(pk=record.pk)
        .order_by("step", "index")
        .values("step", "index", "policy_version", "reward", "finish_reason")[:SAME_TASK_ROWS]
    )
    return [dict(row) for row in rows]
