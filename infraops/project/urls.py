"""URLs of the whole site; each app has its own namespace."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from infraops import views
from infraops.project.login import LoginView, ThrottledAdminAuthenticationForm

# The admin's own login page is throttled the same way.
admin.site.login_form = ThrottledAdminAuthenticationForm

urlpatterns = [
    path("", include("infraops.urls")),
    path("", include("agents.urls")),
    path("reviews/", include("reviews.urls")),
    path("skeletons/", include("skeletons.urls")),
    path("fleet/", include("infraops.fleet_urls")),
    # Throttled: failed sign-ins lock a username or an address for a while
    # (infraops/project/login.py).
    path("accounts/login/", LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("healthz", views.healthz, name="healthz"),
]
