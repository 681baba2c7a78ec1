from io import StringIO

from django.contrib.auth import authenticate
from django.core.management import call_command

from console.accounts.models import Membership, Role, Team
from console.audit.models import AuditEntry


def seed() -> str:
    out = StringIO()
    call_command("seed_demo", stdout=out)
    return out.getvalue()


def test_seed_demo_creates_the_team_and_three_users_whose_printed_logins_work(db):
    output = seed()
    team = Team.objects.get(slug="demo-lab")
    roles = dict(Membership.objects.filter(team=team).values_list("user__username", "role"))
    assert roles == {
        "researcher": Role.RESEARCHER,
        "annotator": Role.ANNOTATOR,
        "admin": Role.ADMIN,
    }
    for line in output.splitlines():
        parts = line.split()
        if parts and parts[0] in roles:
            assert authenticate(username=parts[0], password=parts[1]) is not None
    assert AuditEntry.objects.filter(team=team, action="membership.add").count() == 2


def test_seed_demo_run_twice_changes_nothing_but_keeps_the_logins_working(db):
    seed()
    team = Team.objects.get(slug="demo-lab")
    entries = AuditEntry.objects.count()
    seed()
    assert Team.objects.filter(slug="demo-lab").get() == team
    assert Membership.objects.filter(team=team).count() == 3
    assert AuditEntry.objects.count() == entries
    assert authenticate(username="admin", password="admin-demo-pass") is not None


def test_the_demo_team_admin_administers_the_team_but_is_not_django_staff(db):
    from django.contrib.auth import get_user_model
    from django.test import Client

    # As an older seed left it: the team admin was a Django superuser.
    get_user_model().objects.create_superuser("admin", "admin@demo.invalid", "x" * 12)
    seed()
    admin = get_user_model().objects.get(username="admin")
    assert not admin.is_staff and not admin.is_superuser
    client = Client()
    client.force_login(admin)
    assert client.get("/accounts/members/").status_code == 200
    django_admin = client.get("/admin/registry/domain/")
    assert django_admin.status_code == 302
    assert django_admin["Location"].startswith("/admin/login/")
