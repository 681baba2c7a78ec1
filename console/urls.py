from django.contrib import admin
from django.urls import include, path

from console.api import api
from console.status.metrics import metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("console.accounts.urls")),
    path("api/", api.urls),
    path("audit/", include("console.audit.urls")),
    path("status/", include("console.status.urls")),
    path("metrics", metrics, name="metrics"),
    # /runs/, /models/ and /hosts/: before the registry, whose include catches "".
    path("", include("console.scheduling.urls")),
    path("", include("console.runs.urls")),
    path("", include("console.registry.urls")),
]
