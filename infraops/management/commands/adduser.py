"""manage.py adduser NAME --role engineer|reviewer|viewer [--target T ...] [--password P]
[--admin]

A user sees only the targets they are a member of (infraops.access), in their first role
there; --target makes them one (superusers see every target)."""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from infraops.grants import membership_grant, roles_changed_audit
from infraops.models import Target
from infraops.roles import ENGINEER, ROLES

# The grantor its grants record: the operator, at the command line (infraops.grants).
GRANTOR = "manage.py adduser"


class Command(BaseCommand):
    help = "Create a user (or update its roles) with one or more roles."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--role", action="append", choices=ROLES, required=True,
                            help="engineer, reviewer or viewer; repeat for several.")
        parser.add_argument("--password", help="Default: a generated one, printed once.")
        parser.add_argument("--email", default="")
        parser.add_argument("--admin", action="store_true", help="Also a superuser.")
        parser.add_argument("--target", action="append", default=[],
                            help="A target's name the user joins in their first role; repeat.")

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        password = options["password"] or secrets.token_urlsafe(12)
        with transaction.atomic():
            user, created = User.objects.get_or_create(username=options["username"],
                                                       defaults={"email": options["email"]})
            if created or options["password"]:
                user.set_password(password)
            roles_before = set(user.groups.values_list("name", flat=True))
            superuser_before = user.is_superuser
            # Engineers edit goals in the admin editor, so they are staff.
            user.is_staff = options["admin"] or ENGINEER in options["role"] or user.is_staff
            user.is_superuser = options["admin"] or user.is_superuser
            user.save()
            groups = list(Group.objects.filter(name__in=options["role"]))
            if len(groups) != len(set(options["role"])):
                raise CommandError("Role groups are missing: run `manage.py migrate` first.")
            user.groups.add(*groups)
            roles_changed_audit(user=user, before=roles_before,
                                after=set(user.groups.values_list("name", flat=True)),
                                by=None, superuser_before=superuser_before, by_label=GRANTOR)
            role = next(r for r in ROLES if r in options["role"])
            for name in options["target"]:
                target = Target.objects.filter(name=name).first()
                if target is None:
                    raise CommandError(f"No target named {name!r}: nothing was changed.")
                membership_grant(target=target, user=user, role=role, by=None,
                                 by_label=GRANTOR)
        roles = ", ".join(sorted(g.name for g in user.groups.all()))
        verb = "Created" if created else "Updated"
        shown = f" with password {password}" if created or options["password"] else ""
        joined = f", member of {', '.join(options['target'])}" if options["target"] else ""
        self.stdout.write(f"{verb} {user.get_username()} ({roles}{joined}){shown}")
