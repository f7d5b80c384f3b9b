"""/fleet/: the staff's fleet page, and what workers on other hosts call (infraops/fleet_views.py).
The worker addresses are the contract with the worker side (infraops.experiments.remote)."""

from __future__ import annotations

from django.urls import path, re_path

from infraops import fleet_views

app_name = "fleet"

urlpatterns = [
    path("", fleet_views.fleet_page, name="page"),
    path("workers/<slug:name>/revoke", fleet_views.fleet_revoke, name="revoke"),
    path("api/heartbeat", fleet_views.heartbeat, name="heartbeat"),
    path("api/blobs/<str:sha256>", fleet_views.blob, name="blob"),
    re_path(r"^git/target-(?P<pk>[0-9]{1,18})\.git/(?P<path>info/refs|git-upload-pack|"
            r"git-receive-pack)$", fleet_views.git_smart, name="git"),
    re_path(r"^git/(?P<rest>.*)$", fleet_views.git_unknown, name="git-unknown"),
]
