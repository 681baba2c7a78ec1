# Joins two lines of migrations made in parallel: the scheduler's run fields (0002_run_scheduling)
# and the live pages' discarded samples and run-page counters (0002/0003). They touch different
# columns, so the order between them does not matter.
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0002_run_scheduling"),
        ("runs", "0003_run_page_at_scale"),
    ]

    operations = []  # type: ignore[var-annotated]
