from __future__ import annotations

from django.urls import path

from infraops import views

app_name = "infraops"

urlpatterns = [
    path("targets/<slug:name>/", views.target_detail, name="target"),
    path("targets/<slug:name>/compare/", views.target_compare, name="compare"),
    path("experiments/<int:pk>/", views.experiment_detail, name="experiment"),
]
