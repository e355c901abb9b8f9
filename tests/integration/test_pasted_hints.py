"""Every command ``manage.py durable_agents runs`` prints runs when pasted (issue 31).

Each run below waits on something different, under an id the engine derives (``>`` and
``/`` in it: a shell redirect when unquoted). The test takes every printed command, splits it
as a shell would (``shlex.split``), fills in only the capitalised placeholders a person must
supply (``'<json>'``, ``'<key>'``) and runs it with ``call_command`` against the real database; each
run must then finish. ``resume`` is also checked on its own: a run failed by a misspelled
``AGENTS`` path is resumed once the setting is fixed.
"""

from __future__ import annotations

import shlex
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.base import CommandError

import durable_agents as da
from durable_agents.models import ActionLog, Run
from durable_agents.providers import scripted
from durable_agents.providers.scripted import ScriptedModel
from tests.support.agents import count_effects, echo, gated, halting, inbox, waiting

pytestmark = pytest.mark.django_db(transaction=True)

PREFIX = "python manage.py "
BAD_PATH = "tests.support.no_such_module.agent"  # a misspelled AGENTS entry

# What a person types in place of each placeholder, by subcommand.
FILLS = {
    "answer": {"<json>": '"HAM"'},
    "signal": {"<json>": '{"paid": 500}'},
    "send": {"<key>": "m-1", "<json>": '"stop"'},
    "resolve": {"<json>": '{"charged": true}'},
}


@da.tool(idempotent=True)
def _await_payment(ctx: da.ToolContext) -> str:
    """Wait for the payment callback."""
    return str(ctx.await_signal("paid", timeout=3600))


@da.tool(idempotent=True)
def _nap(ctx: da.ToolContext) -> str:
    """Sleep an hour."""
    return ctx.sleep("cool-off", 3600).isoformat()


def _one_call(name: str, tool) -> da.Agent:
    script = [scripted.calls(scripted.call(tool.name, {})), scripted.text("done")]
    return da.Agent(name, ScriptedModel(script), "", [tool])


payer = _one_call("hint-payer", _await_payment)
napper = _one_call("hint-napper", _nap)


def _user(name: str, *perms: str, superuser: bool = False):
    user = get_user_model().objects.create_user(name, is_staff=True, is_superuser=superuser)
    for codename in perms:
        user.user_permissions.add(
            Permission.objects.get(codename=codename, content_type__app_label="durable_agents")
        )
    return user


def _runs(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("durable_agents", "runs", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def printed_commands(text: str) -> list[str]:
    """Every command in ``runs``' output: a line's text from ``python manage.py`` on."""
    return [line[line.index(PREFIX) :] for line in text.splitlines() if PREFIX in line]


def paste(command: str) -> str:
    """Run a printed command as a shell would split it, placeholders filled in."""
    argv = shlex.split(command)
    assert argv[:3] == ["python", "manage.py", "durable_agents"], command
    fill = FILLS.get(argv[3], {})
    out = StringIO()
    call_command(*[fill.get(a, a) for a in argv[2:]], stdout=out)
    return out.getvalue()


def _pause(exc: type[BaseException], fn, *args) -> None:
    with pytest.raises(exc):
        fn(*args)


def _fail_on_a_misspelled_path(settings, run_id: str) -> dict:
    """Start ``run_id`` (agent ``echo``) while AGENTS names a module that does not exist: the
    drive cannot load its agent and fails it. Returns the good setting, not yet restored."""
    good = settings.DURABLE_AGENTS
    settings.DURABLE_AGENTS = {**good, "AGENTS": [*good["AGENTS"], BAD_PATH]}
    echo.start("where is order 7?", run_id=run_id)
    run = Run.objects.get(run_id=run_id)
    assert run.status == "failed", run.status
    assert run.last_error["code"].startswith("config."), run.last_error
    return good


def test_every_printed_command_runs_when_pasted(settings):
    _pause(da.ApprovalPending, gated.session("hint-ok").send, "refund order 7")
    _pause(da.ApprovalPending, gated.session("hint-no").send, "refund order 7")
    _pause(da.OutcomeUnknown, halting.session("hint-halt").send, "charge")
    _pause(da.InterruptPending, waiting.session("hint-ask").send, "ship o-7")
    _pause(da.SignalPending, payer.session("hint-pay").send, "go")
    _pause(da.TimerPending, napper.session("hint-nap").send, "go")
    _pause(da.Pause, inbox.session("hint-read").send, "read")
    settings.DURABLE_AGENTS = _fail_on_a_misspelled_path(settings, "hint-failed")
    _user("ops", superuser=True)

    text, err = _runs("--by", "ops")
    assert err == ""
    commands = printed_commands(text)
    actions = sorted(shlex.split(c)[3] for c in commands)
    assert actions == [
        "answer",
        *["approve"] * 2,
        *["deny"] * 2,
        "resolve",
        "resume",
        "send",
        "signal",
        "wake",
    ], text
    assert all(shlex.split(c)[-2:] == ["--by", "ops"] for c in commands), text
    # A derived id is quoted: unquoted, its ">" would redirect the shell's output.
    assert "'hint-ok>turn/1'" in text

    ran = []
    for command in commands:
        run_id = shlex.split(command)[4]
        if run_id in ran:  # the other of approve/deny: the call is decided by now
            continue
        if run_id == "hint-no>turn/1" and " approve " in command:
            continue  # this one is denied
        paste(command)
        ran.append(run_id)

    runs = dict(Run.objects.filter(run_id__in=ran).values_list("run_id", "status"))
    assert len(ran) == 8 and runs == dict.fromkeys(ran, "finished"), runs
    assert count_effects("hint-ok>turn/1") and not count_effects("hint-no>turn/1")
    assert _runs("--by", "ops")[0].strip() == "no unfinished runs"
    logged = set(ActionLog.objects.filter(actor="ops").values_list("action", flat=True))
    assert {"approve", "deny", "resolve", "answer", "signal", "wake", "enqueue"} <= logged
    assert {"resume"} <= logged


def test_runs_without_by_prints_a_placeholder_that_a_paste_cannot_act_as():
    _pause(da.ApprovalPending, gated.session("hint-login").send, "refund order 7")
    text, err = _runs()
    assert "--by '<you>'" in text
    assert "replace <you>" in err and "runs --by USERNAME" in err
    [approve, _deny] = printed_commands(text)
    # Pasted as printed, every placeholder is refused by name, and nothing is decided.
    with pytest.raises(CommandError, match=r"<you> \(by\) is a placeholder"):
        paste(approve)
    assert Run.objects.get(run_id="hint-login>turn/1").status == "awaiting_approval"
    _user("ops", "approve_toolcall")
    assert "approved" in paste(approve.replace("'<you>'", "ops"))
    assert Run.objects.get(run_id="hint-login>turn/1").status == "finished"


def test_a_pasted_placeholder_is_refused_by_name():
    _pause(da.Pause, inbox.session("hint-key").send, "read")
    _user("ops", superuser=True)
    [send] = [c for c in printed_commands(_runs("--by", "ops")[0]) if " send " in c]
    argv = shlex.split(send)[2:]
    with pytest.raises(CommandError, match=r"<key> \(key\) is a placeholder"):
        call_command(*argv, stdout=StringIO())
    assert not ActionLog.objects.filter(action="enqueue").exists()


def test_runs_refuses_a_by_that_names_nobody():
    with pytest.raises(CommandError, match=r"actor\.unknown"):
        _runs("--by", "nobody")


def test_resume_continues_a_run_failed_by_a_misspelled_agent_path(settings):
    good = _fail_on_a_misspelled_path(settings, "hint-resume")
    _user("approver", "approve_toolcall")
    _user("ops", "cancel_run")
    resume = ("durable_agents", "resume", "hint-resume")

    # Still misspelled: refused before anything is logged or handed over.
    with pytest.raises(CommandError, match=r"cannot load .*python manage.py check"):
        call_command(*resume, "--by", "ops")
    settings.DURABLE_AGENTS = good
    for by, code in (("nobody", r"actor\.unknown"), ("approver", r"actor\.forbidden")):
        with pytest.raises(CommandError, match=code):
            call_command(*resume, "--by", by)
    assert Run.objects.get(run_id="hint-resume").status == "failed"
    assert not ActionLog.objects.filter(run_id="hint-resume").exists()

    out = StringIO()
    call_command(*resume, "--by", "ops", stdout=out)
    assert "handed to a driver" in out.getvalue()
    run = Run.objects.get(run_id="hint-resume")
    assert (run.status, run.answer) == ("finished", "order 7 shipped")
    entry = ActionLog.objects.get(run_id="hint-resume", action="resume")
    assert (entry.actor, entry.channel) == ("ops", "command")

    with pytest.raises(CommandError, match=r"run\.finished"):
        call_command(*resume, "--by", "ops")
    with pytest.raises(CommandError, match=r"run\.not_found"):
        call_command("durable_agents", "resume", "no-such-run", "--by", "ops")


def test_wait_commands_refuse_bad_json_and_change_nothing():
    _pause(da.InterruptPending, waiting.session("hint-bad").send, "ship o-7")
    _user("ops", superuser=True)
    run_id = "hint-bad>turn/1"
    with pytest.raises(CommandError, match="--value is not valid JSON"):
        call_command(
            "durable_agents", "answer", run_id, "warehouse", "--value", "JSON", "--by", "ops"
        )
    with pytest.raises(CommandError, match=r"interrupt\.invalid_answer"):
        call_command(
            "durable_agents", "answer", run_id, "warehouse", "--value", '"PAR"', "--by", "ops"
        )
    assert Run.objects.get(run_id=run_id).status == "awaiting_input"
    assert not ActionLog.objects.filter(run_id=run_id).exists()


def test_the_command_a_halted_journal_step_names_runs_when_pasted():
    """``Journal.step`` says how to record a step's outcome; its command resolves the halt."""
    from durable_agents.database.store import DjangoStore
    from durable_agents.engine.journal import Journal

    journal = Journal(DjangoStore())

    def charge():
        raise da.ToolOutcomeUnknown("the gateway timed out")

    run_id = "hint-step>1"
    with pytest.raises(da.ToolOutcomeUnknown):
        journal.step(run_id, "charge", charge)
    with pytest.raises(da.OutcomeUnknown) as halted:
        journal.step(run_id, "charge", charge)
    said = str(halted.value)
    command = said[said.index(PREFIX) :]
    _user("ops", "resolve_halt", "cancel_run")
    argv = shlex.split(command)
    assert argv[3:5] == ["resolve", run_id], command
    fill = {"<json>": '{"charged": true}', "<you>": "ops"}
    call_command(*[fill.get(a, a) for a in argv[2:]], stdout=StringIO())
    assert journal.step(run_id, "charge", charge) == {"charged": True}
    with pytest.raises(CommandError, match="not an agent run"):
        call_command("durable_agents", "resume", run_id, "--by", "ops")
