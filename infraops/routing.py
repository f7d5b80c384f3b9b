from __future__ import annotations

from django.urls import path

from infraops.consumers import ExperimentLogConsumer

websocket_urlpatterns = [
    path("ws/experiments/<int:pk>/", ExperimentLogConsumer.as_asgi()),
]
