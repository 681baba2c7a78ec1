"""The trajectory explorer: the role matrix for its three pages, the list's filters and its
keyset cursor, a GRPO group's recomputed advantages, one sample's page (observations,
breakdown, provenance, escaping of model output) and the same task across policy versions.
Real PostgreSQL; trajectories stored with the console Sink as a run stores them."""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from console.runs import explorer, services
from console.runs.models import Attempt, Host, Run, TrajectoryRecord
from console.runs.sink import ConsoleSink
from tests.console.factories import ANONYMOUS, EVERYONE, OUTSIDER, READERS, attempt_create

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


def trajectory(
    step: int,
    group: int,
    reward: float = 1.0,
    *,
    task_id: str = "7",
    domain: str = "parity",
    finish: str = "stop",
    completion: str = "\\boxed{even}",
    breakdown: dict[str, Any] | None = None,
    details: dict[str, Any] | None = None,
    observations: list[dict[str, Any]] | None = None,
    messages: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "messages": messages or [{"role": "user", "content": "Is 4 even?"}],
        "prompt": "Is 4 even?",
        "completion": completion,
        "observations": observations or [],
        "reward": {
            "total": reward,
            "breakdown": {"answer": reward} if breakdown is None else breakdown,
            "details": details or {},
        },
        "finish_reason": finish,
        "response_tokens": 5,
        "task_id": task_id,
        "provenance": {
            "run": "r",
            "step": step,
            "policy_version": step - 1,
            "domain": domain,
            "group": group,
            "rubric_version": 3,
            "rubric_digest": "1:abc",
            "sandbox_image": "python-box@2",
        },
    }


def observation(tool: str = "python", **changes: Any) -> dict[str, Any]:
    return {
        "tool": tool,
        "stdout": "4\n",
        "stderr": "",
        "exit_code": 0,
        "timed_out": False,
        "wall_s": 0.25,
        **changes,
    }


@pytest.fixture
def attempt(people: Any, tmp_path: Path) -> Attempt:
    (tmp_path / "config.json").write_text("{}")
    version = services.model_register(
        actor=people.owner, team=people.team, slug="m", title="M", path=str(tmp_path)
    )
    run = Run.objects.create(
        team=people.team, created_by=people.owner, name="explored", request={}, spec={},
        pins={"domains": [
            {"slug": "parity", "domain_id": 1, "rubric_id": 41, "rubric_version": 3,
             "taskset_version": 1},
            {"slug": "tools", "domain_id": 2, "rubric_version": 3, "taskset_version": 1},
        ]},
        model_version=version,
    )  # fmt: skip
    host = Host.objects.create(name="h", cpu_slots=1)
    return attempt_create(run, host, state="running")


@pytest.fixture
def run(attempt: Attempt) -> Run:
    """Two steps of two groups of two samples (indices 0..3 per step) plus one sample with
    tool calls: step 1 rewards 0, 1 | 0.5, 0.5 ; step 2 rewards 1, 1 | 0, 0.25 ; step 3: one
    tool-using sample."""
    sink = ConsoleSink(attempt)
    sink.trajectories(
        [
            trajectory(1, 0, 0.0, finish="length"),
            trajectory(1, 0, 1.0),
            trajectory(1, 1, 0.5, task_id="8"),
            trajectory(1, 1, 0.5, task_id="8"),
        ]
    )
    sink.trajectories(
        [
            trajectory(2, 0, 1.0),
            trajectory(2, 0, 1.0),
            trajectory(2, 1, 0.0, task_id="8", breakdown={"answer": 0.0, "style": 0.9}),
            trajectory(2, 1, 0.25, task_id="8", breakdown={"answer": 0.25, "style": 0.1}),
        ]
    )
    sink.trajectories(
        [
            trajectory(
                3,
                0,
                0.75,
                task_id="9",
                domain="tools",
                observations=[observation(), observation("shell", exit_code=None, timed_out=True)],
                breakdown={"answer": 0.75, "style": 0.5},
            )
        ]
    )
    return attempt.run


def keys(rows: list[TrajectoryRecord]) -> list[tuple[int, int]]:
    return [(row.step, row.index) for row in rows]


def listed(run: Run, **query: str) -> list[tuple[int, int]]:
    return keys(explorer.trajectory_page(run, explorer.Filters.from_query(query)).rows)


# --- the role matrix ------------------------------------------------------------------------

PAGES: dict[str, Callable[[Run], str]] = {
    "list": lambda run: reverse("runs:trajectory_list", args=[run.pk]),
    "list_htmx": lambda run: reverse("runs:trajectory_list", args=[run.pk]) + "?domain=parity",
    "group": lambda run: reverse("runs:trajectory_group", args=[run.pk, 1, 0]),
    "sample": lambda run: reverse("runs:trajectory_detail", args=[run.pk, 1, 1]),
}


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize("who", EVERYONE)
def test_the_explorer_is_for_every_team_member(
    page: str, who: str, client_as: Callable[[str], Client], run: Run
) -> None:
    response = client_as(who).get(PAGES[page](run), **(HTMX if page == "list_htmx" else {}))
    if who == ANONYMOUS:
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")
    elif who == OUTSIDER:
        assert response.status_code == 404
    else:
        assert who in READERS
        assert response.status_code == 200, who


def test_missing_groups_and_samples_are_404(owner_client: Client, run: Run) -> None:
    assert (
        owner_client.get(reverse("runs:trajectory_group", args=[run.pk, 1, 9])).status_code == 404
    )
    assert (
        owner_client.get(reverse("runs:trajectory_detail", args=[run.pk, 9, 0])).status_code == 404
    )
    assert owner_client.get(reverse("runs:trajectory_list", args=[run.pk + 99])).status_code == 404


# --- the list -------------------------------------------------------------------------------


def test_the_list_shows_newest_steps_first_and_index_order_within_a_step(run: Run) -> None:
    assert listed(run) == [(3, 0), (2, 0), (2, 1), (2, 2), (2, 3), (1, 0), (1, 1), (1, 2), (1, 3)]
    row = explorer.trajectory_page(run, explorer.Filters()).rows[0]
    assert row.group == "0" and row.tool_calls == 2 and row.completion_head == "\\boxed{even}"


def test_filters_select_the_right_rows(run: Run) -> None:
    assert listed(run, step="2") == [(2, 0), (2, 1), (2, 2), (2, 3)]
    assert listed(run, domain="tools") == [(3, 0)]
    assert listed(run, min_reward="0.5", max_reward="0.75") == [(3, 0), (1, 2), (1, 3)]
    assert listed(run, max_reward="0") == [(2, 2), (1, 0)]
    assert listed(run, finish="length") == [(1, 0)]
    assert listed(run, tools="with") == [(3, 0)]
    assert len(listed(run, tools="without")) == 8 and (3, 0) not in listed(run, tools="without")
    # A criterion alone keeps the samples scored on it; with a minimum, those at or above it.
    assert listed(run, criterion="style") == [(3, 0), (2, 2), (2, 3)]
    assert listed(run, criterion="style", criterion_min="0.5") == [(3, 0), (2, 2)]
    assert listed(run, criterion="answer", criterion_min="1", step="2") == [(2, 0), (2, 1)]
    # Filters combine.
    assert listed(run, criterion="style", criterion_min="0.5", domain="parity") == [(2, 2)]


def test_odd_filter_values_are_left_out_and_odd_criterion_names_are_safe(
    run: Run, attempt: Attempt
) -> None:
    filters = explorer.Filters.from_query({"step": "x", "min_reward": "nan", "finish": "weird"})
    assert set(filters.ignored) == {"step", "min_reward", "finish"} and not filters.active
    assert len(listed(run, step="-1", tools="maybe")) == 9
    assert listed(run, criterion="no'such\"__key") == []
    # A non-numeric score is never cast (no database error), only left out.
    ConsoleSink(attempt).trajectories([trajectory(4, 0, 1.0, breakdown={"answer": "yes"})])
    assert listed(run, criterion="answer", criterion_min="0", step="4") == []


def test_the_cursor_pages_without_gaps_or_repeats(run: Run, attempt: Attempt) -> None:
    sink = ConsoleSink(attempt)
    for step in range(4, 9):
        sink.trajectories([trajectory(step, g, g / 7) for g in range(7)])
    everything = listed(run)
    assert len(everything) == 9 + 35
    seen: list[tuple[int, int]] = []
    after = None
    pages = 0
    while True:
        page = explorer.trajectory_page(run, explorer.Filters(), after=after, limit=5)
        seen.extend(keys(page.rows))
        pages += 1
        if page.next_cursor is None:
            break
        after = explorer.parse_cursor(page.next_cursor)
    assert seen == everything and len(set(seen)) == len(seen)
    assert pages == 9  # 44 rows, 5 a page: no empty page at the end
    # Filtered pages too, and through the page's own links.
    filtered = listed(run, min_reward="0.4")
    seen = []
    after = None
    while True:
        page = explorer.trajectory_page(run, explorer.Filters(min_reward=0.4), after=after, limit=4)
        seen.extend(keys(page.rows))
        if page.next_cursor is None:
            break
        after = explorer.parse_cursor(page.next_cursor)
    assert seen == filtered


def test_the_page_links_keep_the_filters_and_htmx_gets_the_table(
    owner_client: Client, run: Run, attempt: Attempt
) -> None:
    sink = ConsoleSink(attempt)
    for step in range(4, 20):
        sink.trajectories([trajectory(step, g, 1.0) for g in range(4)])
    url = reverse("runs:trajectory_list", args=[run.pk])
    response = owner_client.get(url, {"domain": "parity", "min_reward": "1"})
    content = response.content.decode()
    assert 'id="trajectory-filters"' in content and 'hx-push-url="true"' in content
    assert content.count("<tr>") == 1 + explorer.PAGE_SIZE
    match = re.search(r'href="\?([^"]*after=[^"]*)"', content)
    assert match, "no link to older rows"
    query = match[1].replace("&amp;", "&")
    assert "domain=parity" in query and "min_reward=1.0" in query
    second = owner_client.get(url + "?" + query, **HTMX).content.decode()
    assert "<html" not in second and 'id="trajectory-table"' in second
    assert "trajectory-filters" not in second
    # 16 * 4 rows of reward 1 + 2 of the fixture (1, 1), (2, 0), (2, 1): 67 rows; 17 remain.
    assert second.count("<tr>") == 1 + 67 - explorer.PAGE_SIZE
    assert "Older" not in second and "Newest" in second


# --- one group ------------------------------------------------------------------------------


def test_advantages_follow_grpo() -> None:
    rewards = [0.0, 1.0, 1.0, 0.5]
    mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
    assert explorer.advantages(rewards) == pytest.approx(
        [(r - mean) / (std + 1e-6) for r in rewards]
    )
    assert explorer.advantages([0.5, 0.5]) == [0.0, 0.0]
    assert explorer.advantages([0.5]) == pytest.approx([0.5 / (1 + 1e-6)])


def test_the_group_page_shows_rewards_breakdowns_and_recomputed_advantages(
    owner_client: Client, run: Run
) -> None:
    group = explorer.group_view(run, 2, 1)
    assert group is not None
    assert [s["record"].index for s in group.samples] == [2, 3]
    assert group.criteria == ["answer", "style"]
    assert [s["scores"] for s in group.samples] == [[0.0, 0.9], [0.25, 0.1]]
    std = statistics.stdev([0.0, 0.25])
    assert [s["advantage"] for s in group.samples] == pytest.approx(
        [-0.125 / (std + 1e-6), 0.125 / (std + 1e-6)]
    )
    content = owner_client.get(reverse("runs:trajectory_group", args=[run.pk, 2, 1])).content
    text = content.decode()
    assert "recomputed" in text and "-0.7071" in text and "0.7071" in text
    assert "<th>style</th>" in text and "0.9000" in text
    # A zero-variance group says so.
    flat = owner_client.get(reverse("runs:trajectory_group", args=[run.pk, 1, 1])).content
    assert "zero variance" in flat.decode()


# --- one sample -----------------------------------------------------------------------------


def test_the_sample_page_shows_chat_observations_breakdown_and_provenance(
    owner_client: Client, run: Run, attempt: Attempt
) -> None:
    messages = [
        {"role": "user", "content": "Compute 2+2."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "python", "arguments": '{"code": "print(2+2)"}'},
                }
            ],
        },
        {"role": "tool", "content": "4", "tool_call_id": "call_1", "name": "python"},
        {"role": "assistant", "content": "\\boxed{4}"},
    ]
    ConsoleSink(attempt).trajectories(
        [
            trajectory(
                5,
                2,
                0.5,
                messages=messages,
                observations=[observation(stdout="four\n", stderr="warn: slow")],
                breakdown={"answer": 1.0, "format": 0.0},
                details={"answer": {"expected": "4", "got": "4"}},
            )
        ]
    )
    url = reverse("runs:trajectory_detail", args=[run.pk, 5, 0])
    text = owner_client.get(url).content.decode()
    assert "tool call" in text and "python" in text and "tool result for call_1" in text
    assert "{&#x27;role&#x27;" not in text  # the chat is not shown as flash messages
    assert "&quot;code&quot;: &quot;print(2+2)&quot;" in text  # arguments pretty-printed
    assert "four" in text and "warn: slow" in text and "0.250 s" in text
    assert "<td>format</td>" in text and "&quot;expected&quot;: &quot;4&quot;" in text
    assert reverse("registry:rubric_version", args=[41, 3]) in text
    assert "python-box@2" in text and "1:abc" in text
    assert reverse("runs:trajectory_group", args=[run.pk, 5, 2]) in text

    tools = owner_client.get(reverse("runs:trajectory_detail", args=[run.pk, 3, 0]))
    body = tools.content.decode()
    assert "timed out" in body and "exit code none" in body and "shell" in body
    # Its domain's pin names no rubric: the version is shown without a link.
    assert reverse("registry:rubric_version", args=[41, 3]) not in body


def test_model_output_is_escaped(owner_client: Client, run: Run, attempt: Attempt) -> None:
    evil = "<script>alert('x')</script>"
    ConsoleSink(attempt).trajectories(
        [
            trajectory(
                6,
                0,
                1.0,
                completion=evil,
                messages=[{"role": "assistant", "content": evil}],
                observations=[observation(stdout=evil, stderr=evil, tool=evil)],
                breakdown={evil: 1.0},
                details={evil: {"why": evil}},
            )
        ]
    )
    pages = [
        reverse("runs:trajectory_detail", args=[run.pk, 6, 0]),
        reverse("runs:trajectory_group", args=[run.pk, 6, 0]),
        reverse("runs:trajectory_list", args=[run.pk]) + "?step=6",
    ]
    for url in pages:
        text = owner_client.get(url).content.decode()
        assert "<script>alert" not in text, url
        assert "&lt;script&gt;alert" in text, url


def test_the_same_task_is_listed_across_policy_versions(owner_client: Client, run: Run) -> None:
    record = TrajectoryRecord.objects.get(run=run, step=2, index=2)
    others = explorer.same_task(run, record)
    assert [(o["step"], o["index"], o["policy_version"]) for o in others] == [
        (1, 2, 0),
        (1, 3, 0),
        (2, 3, 1),
    ]
    text = owner_client.get(reverse("runs:trajectory_detail", args=[run.pk, 2, 2])).content
    section = text.decode().split('id="same-task"')[1]
    for step, index in ((1, 2), (1, 3), (2, 3)):
        assert reverse("runs:trajectory_detail", args=[run.pk, step, index]) in section
    assert reverse("runs:trajectory_detail", args=[run.pk, 1, 0]) not in section
    lonely = TrajectoryRecord.objects.get(run=run, step=3, index=0)
    assert explorer.same_task(run, lonely) == []


def test_the_run_page_links_to_the_explorer(owner_client: Client, run: Run) -> None:
    text = owner_client.get(reverse("runs:run_detail", args=[run.pk])).content.decode()
    assert reverse("runs:trajectory_list", args=[run.pk]) in text
