from django.urls import path

from console.scheduling import views

app_name = "scheduling"
urlpatterns = [
    path("scheduling/queue/", views.queue, name="queue"),
    path("scheduling/fleet/", views.fleet, name="fleet"),
    path(
        "scheduling/hosts/<int:pk>/cordon/",
        views.host_action,
        {"action": "cordon"},
        name="host_cordon",
    ),
    path(
        "scheduling/hosts/<int:pk>/drain/",
        views.host_action,
        {"action": "drain"},
        name="host_drain",
    ),
    path(
        "scheduling/hosts/<int:pk>/uncordon/",
        views.host_action,
        {"action": "uncordon"},
        name="host_uncordon",
    ),
    path("scheduling/hosts/<int:pk>/pool/", views.host_pool, name="host_pool"),
    path("scheduling/classes/", views.classes, name="classes"),
    path("scheduling/classes/new/", views.class_create, name="class_create"),
    path("scheduling/classes/<int:pk>/", views.class_edit, name="class_edit"),
    path("scheduling/classes/<int:pk>/delete/", views.class_delete, name="class_delete"),
    path("scheduling/pools/new/", views.pool_create, name="pool_create"),
    path("scheduling/quotas/", views.quota_set, name="quota_set"),
    path("scheduling/preemptions/", views.inbox, name="inbox"),
    path(
        "scheduling/preemptions/<int:pk>/approve/",
        views.preemption_approve,
        name="preemption_approve",
    ),
    path(
        "scheduling/preemptions/<int:pk>/reject/",
        views.preemption_reject,
        name="preemption_reject",
    ),
]
