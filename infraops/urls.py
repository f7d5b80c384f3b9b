"""URLs of the whole site; each app has its own namespace."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from infraops import skeleton_views, views
from infraops.login import LoginView, ThrottledAdminAuthenticationForm

core = ([
    path("targets/<slug:name>/", views.target_detail, name="target"),
    path("experiments/<int:pk>/", views.experiment_detail, name="experiment"),
    path("skeletons/", skeleton_views.skeleton_list, name="skeletons"),
    path("skeletons/<slug:slug>/", skeleton_views.skeleton_detail, name="skeleton"),
    path("skeletons/<slug:slug>/promote/", skeleton_views.skeleton_promote_view,
         name="skeleton_promote"),
], "infraops")

# The admin's own login page is throttled the same way.
admin.site.login_form = ThrottledAdminAuthenticationForm

urlpatterns = [
    path("", include(core)),
    path("", include("agents.urls")),
    path("reviews/", include("reviews.urls")),
    # Throttled: failed sign-ins lock a username or an address for a while (infraops/login.py).
    path("accounts/login/", LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("healthz", views.healthz, name="healthz"),
]
