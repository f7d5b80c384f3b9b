from __future__ import annotations

from django.urls import path

from skeletons import views

app_name = "skeletons"

urlpatterns = [
    path("", views.skeleton_list, name="list"),
    path("<slug:slug>/", views.skeleton_detail, name="detail"),
    path("<slug:slug>/promote/", views.skeleton_promote_view, name="promote"),
]
