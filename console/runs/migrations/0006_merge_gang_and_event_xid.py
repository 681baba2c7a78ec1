# Merges two migrations written in parallel: multi-host allocations and the event xid.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0005_gang_allocations"),
        ("runs", "0005_runevent_xid"),
    ]

    operations = []  # type: ignore[var-annotated]
