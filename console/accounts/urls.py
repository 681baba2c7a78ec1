from django.contrib.auth import views as auth_views
from django.urls import path

# No app_name: "login" and "logout" keep the names Django's auth machinery looks up.
urlpatterns = [
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
]
