"""The audit log refuses TRUNCATE too: 0002's row trigger refuses UPDATE and DELETE, but
TRUNCATE fires no row trigger, so it emptied the table. A statement trigger refuses it.

One exception, for Django's test databases only: between tests, Django's flush empties every
table with one TRUNCATE, the audit log's included. A test database (made by the test runner,
named test_...) gets the session setting infraops.audit_truncate = 'allow' as its default;
no other database does, and the trigger refuses whenever the setting is not 'allow'.
"""

from __future__ import annotations

from django.db import migrations

REFUSE_TRUNCATE = """
CREATE OR REPLACE FUNCTION infraops_audit_no_truncate() RETURNS trigger AS $$
BEGIN
    IF coalesce(current_setting('infraops.audit_truncate', true), '') = 'allow' THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'the audit log is append-only: TRUNCATE is refused';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER infraops_audit_no_truncate
    BEFORE TRUNCATE ON infraops_auditentry
    FOR EACH STATEMENT EXECUTE FUNCTION infraops_audit_no_truncate();
"""
ALLOW_TRUNCATE = """
DROP TRIGGER IF EXISTS infraops_audit_no_truncate ON infraops_auditentry;
DROP FUNCTION IF EXISTS infraops_audit_no_truncate();
"""
TEST_DATABASE_PREFIX = "test_"  # django.db.backends.base.creation.TEST_DATABASE_PREFIX


def allow_flush_in_test_databases(apps, schema_editor):
    connection = schema_editor.connection
    name = connection.settings_dict["NAME"] or ""
    if not name.startswith(TEST_DATABASE_PREFIX):
        return
    quoted = schema_editor.quote_name(name)
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER DATABASE {quoted} SET infraops.audit_truncate = 'allow'")
        cursor.execute("SET infraops.audit_truncate = 'allow'")  # this session, too


class Migration(migrations.Migration):
    dependencies = [
        ("infraops", "0008_experiment_variants"),
    ]

    operations = [
        migrations.RunSQL(REFUSE_TRUNCATE, ALLOW_TRUNCATE),
        migrations.RunPython(allow_flush_in_test_databases, migrations.RunPython.noop),
    ]
