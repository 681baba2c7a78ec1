from django.contrib import admin

from console.audit.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ("at", "team", "actor_name", "action", "target_type", "target_label")
    list_filter = ("action", "target_type", "team")
    search_fields = ("actor_name", "target_label", "target_id")

    # The log is append-only, for staff too.
    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

    def has_delete_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False
