from django.contrib import admin

from console.accounts.models import ApiToken, LoginFailure, Membership, Team


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


@admin.register(LoginFailure)
class LoginFailureAdmin(admin.ModelAdmin):
    """Failed logins in the throttle window. Staff unlock an account or address by deleting
    its rows; nobody adds or edits them here."""

    list_display = ("username", "address", "at")
    list_filter = ("at",)
    search_fields = ("username", "address")
    readonly_fields = ("username", "address", "at")

    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False
