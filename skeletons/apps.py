from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class SkeletonsConfig(AppConfig):
    name = "skeletons"
    verbose_name = "Skeleton library"

    def ready(self) -> None:
        from reviews.signals import change_decided, change_submitted
        from skeletons import receivers
        from skeletons import tools as _tools  # noqa: F401  (registers the agent's tools)

        post_migrate.connect(receivers.grant_roles, sender=self, dispatch_uid="skeletons-roles")
        change_submitted.connect(receivers.uses_ride_on_change,
                                 dispatch_uid="skeletons-change-submitted")
        change_submitted.connect(receivers.uses_from_knobs,
                                 dispatch_uid="skeletons-change-submitted-knobs")
        change_decided.connect(receivers.outcome_later, dispatch_uid="skeletons-change-decided")
