"""Reads for the step timeline: one step of a run as a Gantt chart, from the ``step.timeline``
event the loop sends after each step (`training.metrics` documents its fields), and the steps
a researcher would open first (the slowest).

A span is ``{stage, start_s, end_s, rank}`` in seconds from the step's start, one per stage and
rank (``rollout``, ``tools`` and ``reward`` once per generation round, with ``round``);
``rollout`` and ``tools`` carry ``busy_s``, the seconds the stage itself took inside its window
(an episode interleaves generation and tool calls, so both span the same wall time). A span
may name its ``host``; otherwise the ranks ran on the attempt's host.

Idle time: on each rank, the parts of ``[0, step_s]`` that no span covers, i.e. where the rank
waited (for the others, for the gather, or for the loop between stages). The rank with the
most idle time is the one that waits.

Callers check the team (console.accounts.access) first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from django.db.models import F, FloatField
from django.db.models.fields.json import KT
from django.db.models.functions import Cast

from console.runs.models import Run, RunEvent

TIMELINE_KIND = "step.timeline"
# The loop's stages in the order a step runs them; stages not listed here (a newer loop's)
# come after, by name.
STAGE_ORDER = (
    "rollout",
    "tools",
    "reward",
    "logprobs",
    "train",
    "weight_sync",
    "checkpoint",
)
STAGE_LABELS = {
    "rollout": "Rollout",
    "tools": "Tool calls",
    "reward": "Reward scoring",
    "logprobs": "Ref/old log-probs",
    "train": "Update",
    "weight_sync": "Weight sync",
    "checkpoint": "Checkpoint",
}
SLOWEST_STEPS = 10
# Gaps shorter than this are rounding between two stages' clocks, not waiting.
MIN_GAP_S = 1e-3


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


@dataclass
class Span:
    stage: str
    start_s: float
    end_s: float
    rank: int
    host: str
    busy_s: float | None = None
    round: int | None = None
    # Where the bar sits on the chart, in percent of the step (set by `step_timeline`).
    left_pct: float = 0.0
    width_pct: float = 0.0

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "stage": self.stage,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "rank": self.rank,
            "host": self.host,
        }
        if self.busy_s is not None:
            out["busy_s"] = self.busy_s
        if self.round is not None:
            out["round"] = self.round
        return out


@dataclass
class Lane:
    """One stage on one rank: its spans (several with dynamic sampling's rounds)."""

    stage: str
    spans: list[Span]

    @property
    def label(self) -> str:
        return STAGE_LABELS.get(self.stage, self.stage)

    @property
    def seconds(self) -> float:
        return sum(span.busy_s if span.busy_s is not None else span.seconds for span in self.spans)


@dataclass
class RankRow:
    rank: int
    host: str
    lanes: list[Lane]
    gaps: list[tuple[float, float]]  # (start_s, end_s) where no span covers the rank
    gap_bars: list[dict[str, float]]  # the gaps as bars: start_s, seconds, left_pct, width_pct
    busy_s: float
    idle_s: float
    waits_most: bool = False


@dataclass
class Timeline:
    step: int
    step_s: float
    attempt: int | None
    ranks: list[RankRow]
    stages: list[dict[str, Any]]  # per stage: label, seconds summed over ranks, share of step
    spans: list[Span] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "step_s": self.step_s,
            "attempt": self.attempt,
            "spans": [span.as_dict() for span in self.spans],
            "ranks": [
                {
                    "rank": row.rank,
                    "host": row.host,
                    "busy_s": row.busy_s,
                    "idle_s": row.idle_s,
                    "gaps": [list(gap) for gap in row.gaps],
                }
                for row in self.ranks
            ],
        }


def _stage_key(stage: str) -> tuple[int, str]:
    return (STAGE_ORDER.index(stage), "") if stage in STAGE_ORDER else (len(STAGE_ORDER), stage)


def _spans(raw: Any, default_host: str) -> list[Span]:
    spans = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict):
            continue
        start, end = _number(item.get("start_s")), _number(item.get("end_s"))
        rank = item.get("rank", 0)
        if start is None or end is None or not isinstance(rank, int) or end < start:
            continue  # a span that cannot be drawn is left out, not guessed
        round_ = item.get("round")
        spans.append(
            Span(
                stage=str(item.get("stage", "?"))[:64],
                start_s=start,
                end_s=end,
                rank=rank,
                host=str(item.get("host") or default_host),
                busy_s=_number(item.get("busy_s")),
                round=round_ if isinstance(round_, int) and not isinstance(round_, bool) else None,
            )
        )
    return spans


def _gaps(spans: list[Span], step_s: float) -> list[tuple[float, float]]:
    """The parts of [0, step_s] that no span covers."""
    gaps = []
    covered_to = 0.0
    for span in sorted(spans, key=lambda s: s.start_s):
        if span.start_s - covered_to > MIN_GAP_S:
            gaps.append((covered_to, span.start_s))
        covered_to = max(covered_to, span.end_s)
    if step_s - covered_to > MIN_GAP_S:
        gaps.append((covered_to, step_s))
    return gaps


def _bar(start: float, end: float, step_s: float) -> tuple[float, float]:
    """Left edge and width in percent of the step; a bar is at least a sliver wide."""
    if step_s <= 0:
        return 0.0, 100.0
    left = min(max(start / step_s * 100.0, 0.0), 100.0)
    width = max(min((end - start) / step_s * 100.0, 100.0 - left), 0.2)
    return round(left, 3), round(width, 3)


def _gap_bar(start: float, end: float, step_s: float) -> dict[str, float]:
    left, width = _bar(start, end, step_s)
    return {"start_s": start, "seconds": end - start, "left_pct": left, "width_pct": width}


def timeline_event(run: Run, step: int) -> RunEvent | None:
    """The newest timeline of `step` (an attempt that re-ran the step replaced the older)."""
    return (
        RunEvent.objects.filter(run=run, kind=TIMELINE_KIND, step=step)
        .select_related("attempt__host")
        .order_by("-id")
        .first()
    )


def step_timeline(run: Run, step: int) -> Timeline | None:
    event = timeline_event(run, step)
    if event is None:
        return None
    data = event.data if isinstance(event.data, dict) else {}
    host = event.attempt.host.name if event.attempt is not None else ""
    spans = _spans(data.get("stages"), host)
    step_s = _number(data.get("step_s"))
    if step_s is None:
        step_s = max((span.end_s for span in spans), default=0.0)
    step_s = max(step_s, max((span.end_s for span in spans), default=0.0))
    for span in spans:
        span.left_pct, span.width_pct = _bar(span.start_s, span.end_s, step_s)
    by_rank: dict[int, list[Span]] = {}
    for span in spans:
        by_rank.setdefault(span.rank, []).append(span)
    rows = []
    for rank, rank_spans in sorted(by_rank.items()):
        lanes: dict[str, list[Span]] = {}
        for span in sorted(rank_spans, key=lambda s: s.start_s):
            lanes.setdefault(span.stage, []).append(span)
        gaps = _gaps(rank_spans, step_s)
        idle = sum(end - start for start, end in gaps)
        rows.append(
            RankRow(
                rank=rank,
                host=rank_spans[0].host,
                lanes=[
                    Lane(stage, lane)
                    for stage, lane in sorted(lanes.items(), key=lambda i: _stage_key(i[0]))
                ],
                gaps=gaps,
                gap_bars=[_gap_bar(start, end, step_s) for start, end in gaps],
                busy_s=step_s - idle,
                idle_s=idle,
            )
        )
    rows.sort(key=lambda row: (row.host, row.rank))
    if len(rows) > 1:
        most = max(rows, key=lambda row: row.idle_s)
        most.waits_most = most.idle_s > MIN_GAP_S
    totals: dict[str, float] = {}
    for row in rows:
        for lane in row.lanes:
            totals[lane.stage] = totals.get(lane.stage, 0.0) + lane.seconds
    ranks = max(len(rows), 1)
    stages = [
        {
            "stage": stage,
            "label": STAGE_LABELS.get(stage, stage),
            "seconds": seconds / ranks,  # per rank, on average
            "share": (seconds / ranks) / step_s if step_s > 0 else 0.0,
        }
        for stage, seconds in sorted(totals.items(), key=lambda i: _stage_key(i[0]))
    ]
    return Timeline(
        step=step,
        step_s=step_s,
        attempt=event.attempt.number if event.attempt is not None else None,
        ranks=rows,
        stages=stages,
        spans=sorted(spans, key=lambda s: (s.rank, s.start_s, _stage_key(s.stage))),
    )


def slowest_steps(run: Run, limit: int = SLOWEST_STEPS) -> list[dict[str, Any]]:
    """The steps with a timeline that took longest, slowest first: ``{step, step_s}``."""
    rows = (
        RunEvent.objects.filter(run=run, kind=TIMELINE_KIND, step__isnull=False)
        .annotate(step_s=Cast(KT("data__step_s"), FloatField()))
        .filter(step_s__isnull=False)
        .order_by(F("step_s").desc(), "step")
        .values("step", "step_s")[:limit]
    )
    return [dict(row) for row in rows]


def timeline_steps(run: Run) -> tuple[int | None, int | None]:
    """The first and last step that have a timeline (for the step picker)."""
    steps = RunEvent.objects.filter(run=run, kind=TIMELINE_KIND, step__isnull=False)
    first = steps.order_by("step").values_list("step", flat=True).first()
    last = steps.order_by("-step").values_list("step", flat=True).first()
    return first, last


def neighbours(run: Run, step: int) -> tuple[int | None, int | None]:
    """The steps with a timeline just before and just after `step`."""
    steps = RunEvent.objects.filter(run=run, kind=TIMELINE_KIND)
    before = steps.filter(step__lt=step).order_by("-step").values_list("step", flat=True).first()
    after = steps.filter(step__gt=step).order_by("step").values_list("step", flat=True).first()
    return before, after
