"""InfraOps core: targets, goals, boundaries, criteria, probes, experiments, feedback."""

from __future__ import annotations

from infraops.celery import app as celery_app

__all__ = ("celery_app",)
