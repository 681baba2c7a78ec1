from django.urls import path

from console.status import views

app_name = "status"
urlpatterns = [path("", views.status_page, name="page")]
