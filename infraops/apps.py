from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class InfraopsConfig(AppConfig):
    name = "infraops"
    verbose_name = "InfraOps"

    def ready(self) -> None:
        from infraops.experiments.results import experiment_changed
        from infraops.roles import ensure_roles
        from infraops.signals import experiment_finished

        # After auth's own handler has made this app's permissions (auth is listed first).
        post_migrate.connect(ensure_roles, sender=self, dispatch_uid="infraops-roles")
        # An experiment's open pages re-read it when it ends (after the commit).
        experiment_finished.connect(experiment_changed, dispatch_uid="infraops-experiment-page")
