from django.urls import path  # noqa: F401  (used as apps add their consumers)

websocket_urlpatterns: list = []
