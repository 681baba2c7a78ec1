from typing import Any

from django.apps import AppConfig


def _close_websockets_of_ended_session(sender: Any, request: Any, **kwargs: Any) -> None:
    # A signal, not the logout view, because every logout path sends it (/accounts/logout/,
    # /admin/logout/, and any added later). It only hands the session key on.
    from console.broadcast import session_ended

    session = getattr(request, "session", None)
    session_ended(getattr(session, "session_key", None))


class AccountsConfig(AppConfig):
    name = "console.accounts"
    label = "accounts"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out

        user_logged_out.connect(
            _close_websockets_of_ended_session, dispatch_uid="close_websockets_on_logout"
        )
