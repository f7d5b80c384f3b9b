from __future__ import annotations

from django.urls import path

from reviews.consumers import ReviewsConsumer

websocket_urlpatterns = [
    path("ws/reviews/", ReviewsConsumer.as_asgi()),
]
