from __future__ import annotations

from django.urls import path

from agents.consumers import RunConsumer

websocket_urlpatterns = [
    path("ws/runs/<int:pk>/", RunConsumer.as_asgi()),
]
