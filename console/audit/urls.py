from django.urls import path

from console.audit import views

app_name = "audit"
urlpatterns = [path("", views.entry_list, name="list")]
