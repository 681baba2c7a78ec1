from django.contrib import admin

from console.accounts.models import ApiToken, Membership, Team


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "created_at")
    search_fields = ("slug", "name")
    inlines = [MembershipInline]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Staff may see and revoke tokens; the digest is never shown and tokens are made by users."""

    list_display = ("name", "prefix", "user", "team", "created_at", "last_used_at", "revoked_at")
    list_filter = ("team",)
    search_fields = ("name", "prefix", "user__username")
    fields = ("name", "prefix", "user", "team", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("name", "prefix", "user", "team", "created_at", "last_used_at")

    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False
