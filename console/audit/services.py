"""The audit log's only writer. Call it inside the writing service's transaction, so the
entry commits (or rolls back) together with the change it records."""

from __future__ import annotations

import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, transaction

from console.accounts.models import Team
from console.audit.models import AuditEntry


def _json_safe(value: dict[str, Any] | None) -> dict[str, Any] | None:
    # Dates, decimals and UUIDs become strings, so any service's dict can be recorded.
    if value is None:
        return None
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


def target_type_of(target: models.Model) -> str:
    """`app_label.model`, e.g. `registry.domain`: the name used to filter the log."""
    return target._meta.label_lower


def audit_record(
    *,
    actor: Any,
    team: Team,
    action: str,
    target: models.Model,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> AuditEntry:
    """Record that `actor` did `action` (e.g. `domain.create`) to `target` in `team`.

    `target` must already have a primary key (record after saving a new object, before deleting
    an old one). Raises if called outside a transaction: an entry committed without its change
    (or a change without its entry) would make the log lie."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("audit_record must be called inside the writing service's transaction")
    if target.pk is None:
        raise ValueError("audit_record needs a saved target (it has no primary key yet)")
    if not action or len(action) > 100:
        raise ValueError("action must be a short name such as 'domain.create'")
    is_user = getattr(actor, "is_authenticated", False)
    return AuditEntry.objects.create(
        team=team,
        actor=actor if is_user else None,
        actor_name=actor.get_username() if is_user else "system",
        action=action,
        target_type=target_type_of(target),
        target_id=str(target.pk),
        target_label=str(target)[:300],
        before=_json_safe(before),
        after=_json_safe(after),
    )
