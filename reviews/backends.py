"""The authentication backend: Django's ModelBackend, with the user of each request read in
one query together with what every page asks of it.

Every page shows the navigation, which needs the user's roles (their group names) and, for a
reviewer, the risk classes of their profile. Read one by one, that was three queries a request
before the view did anything; here the groups come as an array column of the user's own row
and the profile by a join. Sign-in and permissions are ModelBackend's, unchanged.

The preloaded values describe the user as they were when this instance was read, which for a
page is the request itself. A websocket's user lives for hours: its consumer re-reads roles and
classes (infraops.consumers), and `infraops.access.request_roles` uses the preloaded names only
for a request's user.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group, User
from django.contrib.postgres.expressions import ArraySubquery
from django.db.models import OuterRef

from infraops.access import GROUP_NAMES_ATTRIBUTE


class OneQueryUserBackend(ModelBackend):
    def get_user(self, user_id: Any) -> User | None:
        names = Group.objects.filter(user=OuterRef("pk")).values("name")
        user = (User._default_manager.select_related("reviewer_profile")
                .annotate(**{GROUP_NAMES_ATTRIBUTE: ArraySubquery(names)})
                .filter(pk=user_id).first())
        return user if user is not None and self.user_can_authenticate(user) else None
