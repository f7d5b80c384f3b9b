from __future__ import annotations

from django.urls import path

from agents import views

app_name = "agents"
urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("goals/<int:pk>/", views.goal_detail, name="goal"),
    path("goals/<int:goal_id>/runs/", views.run_start, name="start"),
    path("runs/<int:pk>/", views.run_detail, name="run"),
    path("runs/<int:pk>/steer/", views.run_steer, name="steer"),
    path("runs/<int:pk>/<str:action>/", views.run_control, name="control"),
]
