from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings
from django.db.models.signals import post_migrate, post_save


class InfraopsConfig(AppConfig):
    name = "infraops"
    verbose_name = "InfraOps"

    def ready(self) -> None:
        from infraops.experiments.results import experiment_changed
        from infraops.grants import superuser_created
        from infraops.roles import ensure_roles
        from infraops.signals import experiment_finished

        # After auth's own handler has made this app's permissions (auth is listed first).
        post_migrate.connect(ensure_roles, sender=self, dispatch_uid="infraops-roles")
        # An experiment's open pages re-read it when it ends (after the commit).
        experiment_finished.connect(experiment_changed, dispatch_uid="infraops-experiment-page")
        # createsuperuser is auth's command (auth is listed first, so a command of ours by
        # that name would never be found) and writes no grant: a user created already a
        # superuser gets its grant record here, whatever made it.
        post_save.connect(superuser_created, sender=settings.AUTH_USER_MODEL,
                          dispatch_uid="infraops-superuser-created")
