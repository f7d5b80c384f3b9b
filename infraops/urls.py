from __future__ import annotations

from django.urls import path

from infraops import views

app_name = "infraops"

urlpatterns = [
    path("targets/<slug:name>/", views.target_detail, name="target"),
    path("experiments/<int:pk>/", views.experiment_detail, name="experiment"),
]
