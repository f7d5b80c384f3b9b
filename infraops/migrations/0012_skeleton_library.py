"""Once the skeleton library's tables; they are made by skeletons 0001 now.

The library moved to an app of its own above ``agents`` and ``reviews``, so that the core's
migrations depend on neither. A database on which this migration ran before the move keeps
its tables, which skeletons 0001 adopts as they are.
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [("infraops", "0011_target_memberships")]

    operations: list[migrations.operations.base.Operation] = []
