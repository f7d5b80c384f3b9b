from __future__ import annotations

from django.urls import path

from reviews import views

app_name = "reviews"
urlpatterns = [
    path("", views.queue, name="queue"),
    path("changes/<int:pk>/", views.change_detail, name="change"),
    path("changes/<int:pk>/decide/", views.change_decide, name="decide"),
]
