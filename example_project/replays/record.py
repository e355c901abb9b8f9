"""Record the example project's two replay runs again, after an intended change to the
support agent (its instructions or tools) made them diverge. From the repository root:

    DJANGO_DEBUG=true DURABLE_AGENTS_DEMO_DIR=$(mktemp -d) PYTHONPATH=. \
        DJANGO_SETTINGS_MODULE=example_project.settings \
        .venv/bin/python example_project/replays/record.py example_project/replays

It runs both conversations on a fresh embedded (SQLite) site with the scripted model, decides
the refund (approved / denied), and exports each run into the given folder.
"""

import io
import sys
from pathlib import Path

import django

django.setup()
from django.contrib.auth import get_user_model  # noqa: E402
from django.contrib.auth.models import Group  # noqa: E402
from django.core.management import call_command  # noqa: E402

import durable_agents as da  # noqa: E402
from example_project import agents  # noqa: E402

call_command("migrate", verbosity=0)
User = get_user_model()
sam = User.objects.create(username="sam", is_staff=True, is_superuser=True)
# The refund policy asks a support lead about this refund (docs/approvals.md).
sam.groups.add(Group.objects.get_or_create(name="support-leads")[0])
text = "My order 7 arrived two weeks late. I want my money back."
for run_id, approved, note in [
    ("support-refund-approved", True, "late delivery confirmed"),
    ("support-refund-denied", False, "already refunded by phone; do not refund again"),
]:
    try:
        agents.support.run(run_id, text)
    except da.ApprovalPending as exc:
        print(run_id, "pending", exc.details.get("calls"))
        (call,) = exc.details["calls"]
    da.approve(run_id, call, approved, by=sam, note=note)
    result = agents.support.run(run_id)
    print(run_id, "->", result.answer)
    buf = io.StringIO()
    call_command("durable_agents", "export", run_id, stdout=buf)
    Path(sys.argv[1], f"{run_id}.jsonl").write_text(buf.getvalue())
