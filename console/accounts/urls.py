from django.contrib.auth import views as auth_views
from django.urls import path

from console.accounts import views

app_name = "accounts"
urlpatterns = [
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("team/", views.team_switch, name="team_switch"),
    path("tokens/", views.token_list, name="tokens"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke, name="token_revoke"),
    path("members/", views.member_list, name="members"),
    path("members/<int:member_id>/role/", views.member_change_role, name="member_role"),
    path("members/<int:member_id>/remove/", views.member_remove, name="member_remove"),
]
