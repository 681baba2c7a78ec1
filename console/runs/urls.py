from django.urls import path

from console.runs import views

app_name = "runs"
urlpatterns = [
    path("runs/", views.run_list, name="run_list"),
    path("runs/new/", views.run_create, name="run_create"),
    # Comparing runs (issue 16, charts): the page; its data is also /api/runs/compare.
    path("runs/compare/", views.run_compare, name="run_compare"),
    path("runs/<int:pk>/", views.run_detail, name="run_detail"),
    path("runs/<int:pk>/cancel/", views.run_command, {"kind": "cancel"}, name="run_cancel"),
    path("runs/<int:pk>/preempt/", views.run_command, {"kind": "preempt"}, name="run_preempt"),
    path("runs/<int:pk>/overrides/", views.run_overrides, name="run_overrides"),
    path(
        "runs/<int:pk>/checkpoints/<int:checkpoint_pk>/promote/",
        views.checkpoint_promote,
        name="checkpoint_promote",
    ),
    path(
        "runs/<int:pk>/trajectories.jsonl",
        views.run_export,
        {"what": "trajectories"},
        name="run_export_trajectories",
    ),
    path(
        "runs/<int:pk>/trajectories.parquet",
        views.run_export,
        {"what": "parquet"},
        name="run_export_parquet",
    ),
    path(
        "runs/<int:pk>/metrics.csv",
        views.run_export,
        {"what": "metrics"},
        name="run_export_metrics",
    ),
    path("runs/<int:pk>/trajectories/", views.trajectory_list, name="trajectory_list"),
    path(
        "runs/<int:pk>/trajectories/<int:step>/<int:index>/",
        views.trajectory_detail,
        name="trajectory_detail",
    ),
    path(
        "runs/<int:pk>/steps/<int:step>/groups/<int:group>/",
        views.trajectory_group,
        name="trajectory_group",
    ),
    path("models/", views.model_list, name="model_list"),
    path("models/<int:pk>/versions/<int:number>/", views.model_version, name="model_version"),
    path("hosts/", views.host_list, name="host_list"),
]

# The step timeline (console.runs.step_views), imported here to keep this block on its own.
from console.runs import step_views  # noqa: E402

urlpatterns += [
    path("runs/<int:pk>/steps/", step_views.step_list, name="step_list"),
    path(
        "runs/<int:pk>/steps/<int:step>/timeline/",
        step_views.step_timeline,
        name="step_timeline",
    ),
]
