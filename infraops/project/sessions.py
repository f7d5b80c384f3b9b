"""Django's database sessions, read with one plain statement.

Every page and socket reads its session first. Through the ORM that read cost about as much
CPU as the query's round trip, most of it building the query anew each time (bench/load.py:
a third of a millisecond of the web process's one core, per request). The statement here is
the one Django's backend sends, written once; saving, expiry and cycling are Django's.
"""

from __future__ import annotations

from typing import Any

from django.contrib.sessions.backends import db
from django.db import connections, router
from django.utils import timezone

# The table of django.contrib.sessions.models.Session, named as a literal (bandit, B608).
_READ = "SELECT session_data FROM django_session WHERE session_key = %s AND expire_date > %s"


class SessionStore(db.SessionStore):
    def load(self) -> dict[str, Any]:
        if self.session_key is None:  # no cookie, or one that is not a valid key
            return {}
        with connections[router.db_for_read(self.model)].cursor() as cursor:
            cursor.execute(_READ, [self.session_key, timezone.now()])
            row = cursor.fetchone()
        if row is None:  # expired or unknown: the next save makes a new key
            self._session_key = None
            return {}
        return self.decode(row[0])
