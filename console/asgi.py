import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from django.core.asgi import get_asgi_application

django_asgi_app = get_asgi_application()

from console.registry.asgi_limits import RequestBodyLimit  # noqa: E402
from console.routing import websocket_urlpatterns  # noqa: E402
from console.websocket_origin import SameOriginValidator  # noqa: E402

application = ProtocolTypeRouter(
    {
        # Refuse an oversized body before Django spools it to disk (a 2 GB task set).
        "http": RequestBodyLimit(django_asgi_app),
        # Same scheme, host and port as the page, or CSRF_TRUSTED_ORIGINS (not just the host).
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
