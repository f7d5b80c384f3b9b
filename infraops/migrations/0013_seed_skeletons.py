"""Once the skeleton library's seeds; skeletons 0002 makes them now (see 0012)."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [("infraops", "0012_skeleton_library")]

    operations: list[migrations.operations.base.Operation] = []
