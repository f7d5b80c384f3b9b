from __future__ import annotations

from django.apps import AppConfig


class InfraopsConfig(AppConfig):
    name = "infraops"
    verbose_name = "InfraOps"
