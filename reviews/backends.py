"""The authentication backend: Django's ModelBackend, with the user of each request read in
one query together with what every page asks of it.

Every page shows the navigation, which needs the user's roles (their group names) and, for a
reviewer, the risk classes of their profile. Read one by one, that was three queries a request
before the view did anything; here the groups come as an array column of the user's own row
and the profile by a join. Sign-in and permissions are ModelBackend's, unchanged.

The statement is written out rather than built by the ORM each time: with the array subquery
and the join, building it cost the web process more CPU than anything else a request does
before its view (bench/load.py). `tests/reviews/test_backends.py` holds the column lists to
the models', so a Django upgrade that adds a column fails there, not on a page.

The preloaded values describe the user as they were when this instance was read, which for a
page is the request itself. A websocket's user lives for hours: its consumer re-reads roles and
classes (infraops.consumers), and `infraops.access.request_roles` uses the preloaded names only
for a request's user.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import User
from django.db import connections, router

from infraops.access import GROUP_NAMES_ATTRIBUTE
from reviews.models import ReviewerProfile

USER_COLUMNS = ("id", "password", "last_login", "is_superuser", "username", "first_name",
                "last_name", "email", "is_staff", "is_active", "date_joined")
PROFILE_COLUMNS = ("id", "user_id", "risk_classes")
# Literal SQL naming the tables of User, Group and ReviewerProfile (bandit, B608).
_READ = """
SELECT u.id, u.password, u.last_login, u.is_superuser, u.username, u.first_name,
       u.last_name, u.email, u.is_staff, u.is_active, u.date_joined,
       p.id, p.user_id, p.risk_classes,
       ARRAY(SELECT g.name FROM auth_group g JOIN auth_user_groups ug ON ug.group_id = g.id
             WHERE ug.user_id = u.id)
FROM auth_user u LEFT JOIN reviews_reviewerprofile p ON p.user_id = u.id
WHERE u.id = %s
"""


class OneQueryUserBackend(ModelBackend):
    def get_user(self, user_id: Any) -> User | None:
        try:
            pk = int(user_id)
        except (TypeError, ValueError):  # a session that names no user id
            return None
        database = router.db_for_read(User)
        with connections[database].cursor() as cursor:
            cursor.execute(_READ, [pk])
            row = cursor.fetchone()
        if row is None:
            return None
        users = len(USER_COLUMNS)
        user = User.from_db(database, USER_COLUMNS, row[:users])
        profile_row = row[users:users + len(PROFILE_COLUMNS)]
        profile = (None if profile_row[0] is None else
                   ReviewerProfile.from_db(database, PROFILE_COLUMNS, profile_row))
        # As select_related would leave them: user.reviewer_profile answers without a query
        # (DoesNotExist where there is none), and the profile's user is this one.
        to_user = ReviewerProfile._meta.get_field("user")
        to_user.remote_field.set_cached_value(user, profile)
        if profile is not None:
            to_user.set_cached_value(profile, user)
        setattr(user, GROUP_NAMES_ATTRIBUTE, list(row[-1]))
        return user if self.user_can_authenticate(user) else None
