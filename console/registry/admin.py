"""The Django admin for staff: browse and search the registry. Versions are read-only here;
published versions are frozen, and drafts change through the pages or the API so that every
change is validated and audited."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from console.registry.models import (
    Domain,
    Rubric,
    RubricVersion,
    SandboxImage,
    SandboxImageVersion,
    Task,
)


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class RubricVersionInline(ReadOnlyInline):
    model = RubricVersion
    fields = ("number", "status", "source_format", "created_by", "published_at", "published_by")


class SandboxImageVersionInline(ReadOnlyInline):
    model = SandboxImageVersion
    fields = (
        "number",
        "status",
        "driver",
        "image_ref",
        "cpu",
        "memory_mb",
        "pids",
        "disk_mb",
        "timeout_s",
        "network",
        "published_at",
    )


@admin.register(Domain)
class DomainAdmin(admin.ModelAdmin):
    list_display = ("slug", "title", "team", "task_count", "held_out_count", "default_mix_weight")
    list_filter = ("team",)
    search_fields = ("slug", "title", "description")
    list_select_related = ("team",)
    raw_id_fields = ("rubric", "sandbox_image", "created_by")
    readonly_fields = (
        "taskset_version",
        "taskset_filename",
        "taskset_uploaded_at",
        "task_count",
        "held_out_count",
        "created_at",
        "updated_at",
    )


@admin.register(Rubric)
class RubricAdmin(admin.ModelAdmin):
    list_display = ("slug", "title", "team", "updated_at")
    list_filter = ("team",)
    search_fields = ("slug", "title", "description")
    list_select_related = ("team",)
    raw_id_fields = ("created_by",)
    inlines = [RubricVersionInline]


@admin.register(SandboxImage)
class SandboxImageAdmin(admin.ModelAdmin):
    list_display = ("slug", "title", "team", "updated_at")
    list_filter = ("team",)
    search_fields = ("slug", "title", "description")
    list_select_related = ("team",)
    raw_id_fields = ("created_by",)
    inlines = [SandboxImageVersionInline]


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(RubricVersion)
class RubricVersionAdmin(ReadOnlyAdmin):
    list_display = ("rubric", "number", "status", "created_by", "published_at")
    list_filter = ("status",)
    list_select_related = ("rubric", "created_by")
    search_fields = ("rubric__slug",)


@admin.register(SandboxImageVersion)
class SandboxImageVersionAdmin(ReadOnlyAdmin):
    list_display = ("image", "number", "status", "driver", "image_ref", "published_at")
    list_filter = ("status", "driver")
    list_select_related = ("image",)
    search_fields = ("image__slug", "image_ref")


@admin.register(Task)
class TaskAdmin(ReadOnlyAdmin):
    list_display = ("domain", "index", "split", "line_number")
    list_filter = ("split",)
    list_select_related = ("domain",)
    search_fields = ("domain__slug",)
    show_full_result_count = False  # a task table can hold millions of rows
