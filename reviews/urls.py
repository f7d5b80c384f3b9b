from __future__ import annotations

from django.urls import path

from reviews.views import change, queue

app_name = "reviews"
urlpatterns = [
    path("", queue.queue, name="queue"),
    path("changes/<int:pk>/", change.change_detail, name="change"),
    path("changes/<int:pk>/decide/", change.change_decide, name="decide"),
    path("changes/<int:pk>/merge/", change.change_merge, name="merge"),
    path("changes/<int:pk>/comments/", change.change_add_comment, name="comment"),
]
