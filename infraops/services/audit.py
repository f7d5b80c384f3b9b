"""The audit log: one helper, called by every service that changes something a human cares about."""

from __future__ import annotations

from typing import Any

from django.db import models

from infraops.models import AuditEntry
from infraops.roles import AnyUser


def audit_record(
    *,
    actor: AnyUser | None,
    action: str,
    obj: models.Model,
    data: dict[str, Any] | None = None,
    actor_label: str = "",
) -> AuditEntry:
    """Append one entry. A system actor (worker, agent) passes actor=None and an actor_label."""
    user = actor if actor is not None and actor.is_authenticated else None
    return AuditEntry.objects.create(
        actor=user,
        actor_label=actor_label or (user.get_username() if user is not None else "system"),
        action=action,
        object_type=obj._meta.label_lower,
        object_id=str(obj.pk),
        data=data or {},
    )
