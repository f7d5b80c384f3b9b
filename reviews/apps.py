from __future__ import annotations

from django.apps import AppConfig


class ReviewsConfig(AppConfig):
    name = "reviews"

    def ready(self) -> None:
        from reviews import receivers  # noqa: F401  (connects to the core's signals)
