from django.urls import path

from console.registry import views

app_name = "registry"
urlpatterns = [
    path("", views.home, name="home"),
    path("domains/", views.domain_list, name="domain_list"),
    path("domains/new/", views.domain_create, name="domain_create"),
    path("domains/<int:pk>/", views.domain_detail, name="domain_detail"),
    path("domains/<int:pk>/edit/", views.domain_edit, name="domain_edit"),
    path("domains/<int:pk>/upload/", views.domain_upload, name="domain_upload"),
    path("domains/<int:pk>/split/", views.domain_resplit, name="domain_resplit"),
    path("rubrics/", views.versioned_list, {"kind": "rubric"}, name="rubric_list"),
    path("rubrics/new/", views.versioned_create, {"kind": "rubric"}, name="rubric_create"),
    path("rubrics/<int:pk>/", views.versioned_detail, {"kind": "rubric"}, name="rubric_detail"),
    path("rubrics/<int:pk>/edit/", views.versioned_edit, {"kind": "rubric"}, name="rubric_edit"),
    path("rubrics/<int:pk>/draft/", views.versioned_draft, {"kind": "rubric"}, name="rubric_draft"),
    path("rubrics/<int:pk>/versions/<int:number>/", views.rubric_version, name="rubric_version"),
    path(
        "rubrics/<int:pk>/versions/<int:number>/try/",
        views.rubric_version_try,
        name="rubric_version_try",
    ),
    path(
        "rubrics/<int:pk>/versions/<int:number>/publish/",
        views.versioned_version_publish,
        {"kind": "rubric"},
        name="rubric_version_publish",
    ),
    path(
        "sandbox-images/",
        views.versioned_list,
        {"kind": "sandbox_image"},
        name="sandbox_image_list",
    ),
    path(
        "sandbox-images/new/",
        views.versioned_create,
        {"kind": "sandbox_image"},
        name="sandbox_image_create",
    ),
    path(
        "sandbox-images/<int:pk>/",
        views.versioned_detail,
        {"kind": "sandbox_image"},
        name="sandbox_image_detail",
    ),
    path(
        "sandbox-images/<int:pk>/edit/",
        views.versioned_edit,
        {"kind": "sandbox_image"},
        name="sandbox_image_edit",
    ),
    path(
        "sandbox-images/<int:pk>/draft/",
        views.versioned_draft,
        {"kind": "sandbox_image"},
        name="sandbox_image_draft",
    ),
    path(
        "sandbox-images/<int:pk>/versions/<int:number>/",
        views.sandbox_image_version,
        name="sandbox_image_version",
    ),
    path(
        "sandbox-images/<int:pk>/versions/<int:number>/publish/",
        views.versioned_version_publish,
        {"kind": "sandbox_image"},
        name="sandbox_image_version_publish",
    ),
]
