"""The project package: settings, URLs, ASGI and Celery wiring, and the web plumbing every
page goes through (middleware, sign-in, sessions, rate limits, context processors).

It is the one place that composes the apps, so it may import any of them; no app imports it
except for the settings Django itself reads.
"""

from __future__ import annotations

from infraops.project.celery import app as celery_app

__all__ = ("celery_app",)
