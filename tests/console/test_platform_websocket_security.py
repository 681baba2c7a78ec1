"""Websocket abuse (issue #10): the origin check compares scheme, host and port; a socket is
closed when its session logs out; binary or non-JSON frames close the socket with the
protocol's code instead of raising in the consumer."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.test import Client
from django.urls import path

from console.asgi import application as console_application
from console.broadcast import TeamGroupConsumer, broadcast_on_commit, team_group
from console.websocket_origin import origin_allowed
from tests.console.factories import OWNER


class ThingsConsumer(TeamGroupConsumer):
    topic = "things"


things_application = AuthMiddlewareStack(
    URLRouter([path("ws/things/<int:team_id>/", ThingsConsumer.as_asgi())])
)


def scope(origin: str | None, host: str | None = "testserver", scheme: str = "ws") -> Any:
    headers = []
    if host is not None:
        headers.append((b"host", host.encode()))
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    return {"type": "websocket", "scheme": scheme, "headers": headers}


# --- origin -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("origin", "host", "scheme"),
    [
        ("http://testserver", "testserver", "ws"),
        ("https://testserver", "testserver", "wss"),
        ("http://127.0.0.1:8000", "127.0.0.1:8000", "ws"),
        ("http://localhost:80", "localhost", "ws"),
        ("HTTP://TestServer", "testserver", "ws"),
    ],
)
def test_the_pages_own_origin_may_open_a_websocket(origin: str, host: str, scheme: str) -> None:
    assert origin_allowed(scope(origin, host, scheme))


@pytest.mark.parametrize(
    ("origin", "host", "scheme", "why"),
    [
        ("http://127.0.0.1:9999", "127.0.0.1:8000", "ws", "another port"),
        ("http://testserver:8080", "testserver", "ws", "another port"),
        ("http://testserver", "testserver", "wss", "plain http page, TLS socket"),
        ("https://testserver", "testserver", "ws", "another scheme"),
        ("http://evil.example", "testserver", "ws", "another host"),
        ("null", "testserver", "ws", "an opaque origin"),
        (None, "testserver", "ws", "no origin"),
        ("http://testserver", None, "ws", "no host"),
        ("http://evil.example", "evil.example", "ws", "a host outside ALLOWED_HOSTS"),
        ("http://testserver:notaport", "testserver", "ws", "a broken origin"),
    ],
)
def test_any_other_origin_is_refused(
    origin: str | None, host: str | None, scheme: str, why: str
) -> None:
    assert not origin_allowed(scope(origin, host, scheme)), why


def test_csrf_trusted_origins_are_allowed_too(settings: Any) -> None:
    settings.CSRF_TRUSTED_ORIGINS = ["https://console.example", "https://*.lab.example"]
    settings.ALLOWED_HOSTS = ["internal"]
    assert origin_allowed(scope("https://console.example", "internal"))
    assert origin_allowed(scope("https://eu.lab.example", "internal"))
    assert not origin_allowed(scope("http://console.example", "internal"))
    assert not origin_allowed(scope("https://console.example:8443", "internal"))


def test_a_proxy_that_terminates_tls_is_believed_only_when_configured(settings: Any) -> None:
    behind_proxy = scope("https://testserver", "testserver", "ws")
    behind_proxy["headers"].append((b"x-forwarded-proto", b"https"))
    assert not origin_allowed(behind_proxy)
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    assert origin_allowed(behind_proxy)


def session_headers(client: Client, origin: str = "http://testserver") -> list[tuple[bytes, bytes]]:
    cookie = client.cookies[django_settings.SESSION_COOKIE_NAME].value
    return [
        (b"host", b"testserver"),
        (b"origin", origin.encode()),
        (b"cookie", f"{django_settings.SESSION_COOKIE_NAME}={cookie}".encode()),
    ]


@pytest.mark.django_db(transaction=True)
def test_the_console_refuses_a_logged_in_socket_from_another_port(client_as: Any) -> None:
    headers = session_headers(client_as(OWNER), origin="http://testserver:9999")

    async def scenario() -> bool:
        communicator = WebsocketCommunicator(console_application, "/ws/status/", headers=headers)
        connected, _ = await communicator.connect(timeout=10)
        await communicator.disconnect()
        return connected

    assert async_to_sync(scenario)() is False


# --- logout -------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_logging_out_closes_the_sessions_websockets(client_as: Any, people: Any) -> None:
    client = client_as(OWNER)
    team_id = people.team.pk
    other_session = client_as(OWNER)  # the same user in another browser stays connected

    async def scenario() -> tuple[Any, Any]:
        mine = WebsocketCommunicator(
            things_application, f"/ws/things/{team_id}/", headers=session_headers(client)
        )
        theirs = WebsocketCommunicator(
            things_application, f"/ws/things/{team_id}/", headers=session_headers(other_session)
        )
        assert (await mine.connect(timeout=10))[0]
        assert (await theirs.connect(timeout=10))[0]
        await sync_to_async(client.post)("/accounts/logout/")
        closed = await mine.receive_output(timeout=10)
        await sync_to_async(broadcast_on_commit)(team_group(team_id, "things"), "x", {"n": 1})
        still_there = await theirs.receive_json_from(timeout=10)
        assert await mine.receive_nothing(timeout=0.5)
        await theirs.disconnect()
        return closed, still_there

    closed, still_there = async_to_sync(scenario)()
    assert closed["type"] == "websocket.close"
    assert closed["code"] == 4401
    assert still_there == {"event": "x", "n": 1}


# --- frames -------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ({"bytes": b"\x00\x01binary"}, 1003),
        ({"text": "not json {"}, 1007),
        ({"text": "[" * 100_000}, 1007),
    ],
)
def test_a_frame_the_consumer_cannot_read_closes_the_socket_cleanly(
    frame: dict[str, Any], code: int, client_as: Any, people: Any
) -> None:
    headers = session_headers(client_as(OWNER))
    team_id = people.team.pk

    async def scenario() -> Any:
        communicator = WebsocketCommunicator(
            things_application, f"/ws/things/{team_id}/", headers=headers
        )
        assert (await communicator.connect(timeout=10))[0]
        await communicator.send_input({"type": "websocket.receive", **frame})
        output = await communicator.receive_output(timeout=10)
        await communicator.disconnect()  # re-raises anything the consumer raised
        return output

    output = async_to_sync(scenario)()
    assert output["type"] == "websocket.close"
    assert output["code"] == code


@pytest.mark.django_db(transaction=True)
def test_valid_json_from_the_browser_is_ignored_and_the_socket_stays_open(
    client_as: Any, people: Any
) -> None:
    headers = session_headers(client_as(OWNER))
    team_id = people.team.pk

    async def scenario() -> Any:
        communicator = WebsocketCommunicator(
            things_application, f"/ws/things/{team_id}/", headers=headers
        )
        assert (await communicator.connect(timeout=10))[0]
        await communicator.send_json_to({"hello": 1})
        await sync_to_async(broadcast_on_commit)(team_group(team_id, "things"), "x", {"n": 2})
        received = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()
        return received

    assert async_to_sync(scenario)() == {"event": "x", "n": 2}
