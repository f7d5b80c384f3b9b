from __future__ import annotations

from django.urls import path

from agents.consumers import DashboardConsumer, RunConsumer

websocket_urlpatterns = [
    path("ws/runs/<int:pk>/", RunConsumer.as_asgi()),
    path("ws/dashboard/", DashboardConsumer.as_asgi()),
]
