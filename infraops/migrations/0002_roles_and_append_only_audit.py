"""The three role groups, and a trigger that makes the audit log append-only."""

from __future__ import annotations

from django.db import migrations

ROLE_PERMISSIONS = {
    "engineer": [
        ("infraops", "target", ("add", "change", "view")),
        ("infraops", "goal", ("add", "change", "view")),
        ("infraops", "boundary", ("add", "change", "view")),
        ("infraops", "acceptancecriterion", ("add", "change", "delete", "view")),
        ("infraops", "goalversion", ("view",)),
        ("infraops", "experiment", ("view",)),
    ],
    "reviewer": [("infraops", "auditentry", ("view",))],
    "viewer": [],
}


def create_roles(apps, schema_editor):
    from django.contrib.auth.management import create_permissions

    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, verbosity=0, apps=apps)
        app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for role, grants in ROLE_PERMISSIONS.items():
        group, _ = Group.objects.get_or_create(name=role)
        for app_label, model, actions in grants:
            for action in actions:
                perm = Permission.objects.filter(
                    content_type__app_label=app_label, codename=f"{action}_{model}"
                ).first()
                if perm is not None:
                    group.permissions.add(perm)


def drop_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=ROLE_PERMISSIONS).delete()


APPEND_ONLY = """
CREATE OR REPLACE FUNCTION infraops_audit_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'the audit log is append-only';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER infraops_audit_append_only
    BEFORE UPDATE OR DELETE ON infraops_auditentry
    FOR EACH ROW EXECUTE FUNCTION infraops_audit_append_only();
"""
DROP_APPEND_ONLY = """
DROP TRIGGER IF EXISTS infraops_audit_append_only ON infraops_auditentry;
DROP FUNCTION IF EXISTS infraops_audit_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("infraops", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.RunPython(create_roles, drop_roles),
        migrations.RunSQL(APPEND_ONLY, DROP_APPEND_ONLY),
    ]
