"""Runs in the admin: the list, the run page (fields, journal timeline, lineage, approvals,
halts, waits, lease, action log) and the commands a run takes: resume and cancel (the action
log's own admin: ``actions``; fork and compare: ``forks``; sessions: ``sessions``; the
awaiting-input queue, answers and "wake now": ``waits``).

Every page is read-only: staff change runs only through engine commands (approve, deny,
resolve, cancel, resume), each behind its own permission and each written to ActionLog.
List pages annotate what they show, so they cost the same number of queries whatever the
page size. See docs/admin.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.db.models import (
    F,
    Func,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    TextField,
)
from django.db.models.functions import Cast, Coalesce, Left
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import URLPattern, reverse
from django.utils import timezone
from django.utils.html import format_html

from ..celery.dispatch import deferred
from ..database import reads
from ..engine import sagas
from ..engine.commands.runs import cancel, delete, hand_over
from ..engine.errors import DurableAgentsError
from ..engine.ports import (
    APPROVAL_PENDING,
    AWAITING_APPROVAL,
    AWAITING_INPUT,
    HALT_OPEN,
    IMPORTED_INERT,
    KIND_AGENT,
    KIND_JOURNAL,
    KIND_SESSION,
    QUEUED,
    RUNNING,
    SLEEPING,
    TERMINAL_STATUSES,
    THROTTLED,
)
from ..engine.registry import get_agent
from ..engine.views import Record, saga_aborted
from ..engine.waits import CHANNEL, INTERRUPT, TIMER, OpenWait, open_waits
from ..models import ActionLog, ApprovalRequest, Halt, Run, RunImport, Throttle
from ..transfer import export_lines
from . import counts, forks, health, live, sessions, tree, waits
from .base import (
    BY_RECOVERY,
    BY_RESUME,
    AnyModelAdmin,
    DefaultStatusFilter,
    ReadOnlyAdmin,
    admin_actor,
    admin_url,
    allows,
    json_cell,
    not_handed_over,
    object_gone,
    page,
    posted_object,
    run_url,
    status_pill,
)
from .inbox import banner_cards
from .paging import DistinctAgentFilter
from .timeline import agent_drift, build_timeline

# -- runs ---------------------------------------------------------------------------------

EXCERPT = 80  # characters of a run's input and answer shown in its list row


class RunChangeList(ChangeList):
    """The runs list reads the first characters of each input and answer in its one query,
    and leaves the large columns (the whole input and answer, usage, fingerprint) unread."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> Any:
        rows = super().get_queryset(request, exclude_parameters)
        return rows.annotate(
            input_head=Left(Cast("input", TextField()), EXCERPT * 2),
            answer_head=Left("answer", EXCERPT + 1),
        ).defer("input", "answer", "usage", "spend", "fingerprint", "last_error")

    def get_results(self, request: HttpRequest) -> None:
        """Also what each paused run on the page waits for, from its wait records: one query
        for the whole page, none when no run on it waits on the world."""
        super().get_results(request)
        paused = [r for r in self.result_list if r.status in (AWAITING_INPUT, SLEEPING)]
        records = reads.wait_records([r.run_id for r in paused]) if paused else {}
        for row in paused:
            row.waiting_for = "; ".join(
                describe_wait(w) for w in open_waits(records.get(row.run_id, []))
            )
        throttled = [r for r in self.result_list if r.status == THROTTLED]
        if throttled:  # one query for the page's throttled runs: what each waits for, till when
            rows = Throttle.objects.filter(run_id__in=[r.run_id for r in throttled])
            why = {t.run_id: t for t in rows}
            for row in throttled:
                t = why.get(row.run_id)
                if t is not None:
                    row.waiting_for = (
                        f"{t.key} ({t.limit}), tries again at {t.retry_at:%Y-%m-%d %H:%M:%S}"
                    )


def describe_wait(wait: OpenWait) -> str:
    """One open wait in a few words, for a list row."""
    when = f" until {wait.deadline:%Y-%m-%d %H:%M}" if wait.deadline else ""
    if wait.kind == INTERRUPT:
        return f"an answer to {wait.name!r}"
    if wait.kind == TIMER:
        return f"timer {wait.name!r}{when.replace(' until', ' at')}"
    if wait.kind == CHANNEL:
        return f"a message on {wait.name!r}"
    return f"signal {wait.name!r}{when}"


def excerpt(text: str | None, *, json_text: bool = False) -> str:
    """The start of an input or an answer for a list row, on one line."""
    if text is None:
        return "-"
    if json_text and text.startswith('"'):  # a string input: itself, not its JSON
        text = text[1:].removesuffix('"').replace('\\"', '"').replace("\\n", " ")
    text = " ".join(text.split())
    return text if len(text) <= EXCERPT else text[: EXCERPT - 1].rstrip() + "…"


def in_tree_count(model: Any, **filters: Any) -> Any:
    """A correlated COUNT of ``model``'s rows of the run, and, for a root, of every sub-run
    of its tree (one query with the page, like ``related_count``). Two counts added, each
    read through an index (the run's rows; its tree's runs, then their rows): as one count
    with an OR, each list row joined every pending row to its run, and a deep page, whose
    skipped rows are counted too, cost a second per thousand pending rows."""

    def count(where: Q) -> Coalesce:
        rows = (
            model.objects.filter(where, **filters)
            .order_by()
            .annotate(n=Func(F("pk"), function="COUNT"))  # an aggregate with no GROUP BY
            .values("n")
        )
        return Coalesce(Subquery(rows, output_field=IntegerField()), 0)

    own = Q(run_id=OuterRef("pk"))
    return count(own) + count(Q(run__root_run_id=OuterRef("pk")) & ~own)


class KindFilter(DefaultStatusFilter):
    """Agent runs by default: a session's journal (``<id>>session``) and plain journals are
    not runs a person drives or decides (sessions have their own page)."""

    title = "kind"
    parameter_name = "kind"
    default = KIND_AGENT
    options = [
        (KIND_AGENT, "agent runs"),
        (KIND_SESSION, "session journals"),
        (KIND_JOURNAL, "plain journals"),
    ]

    def queryset(self, request: Any, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset if value == "all" else queryset.filter(kind=value)


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    # Few columns, so the list fits beside the admin's menus at 1400 px: the run (with its
    # agent and last update), its status, the start of its input and answer, and what it
    # waits on (people: approvals and halts, its sub-runs' included; the world).
    list_display = (
        "run_cell",
        "status_pill",
        "input_excerpt",
        "answer_excerpt",
        "waits_for",
    )
    list_display_links = None  # the run cell links the run's page itself
    list_filter = (
        "status",
        KindFilter,
        ("agent", DistinctAgentFilter),
        ("created_at", admin.DateFieldListFilter),
        tree.TreeFilter,
    )
    # The input is searched as its JSON text (a string input as itself, in quotes); the
    # input and answer searches scan the rows the other filters leave.
    search_fields = ("run_id", "session_id", "input", "answer")
    search_help_text = "Search by run id, session id, input or answer."
    # Facet counts are a COUNT per filter choice over the whole table: never on runs.
    show_facets = admin.ShowFacets.NEVER
    actions = ["resume_selected", "cancel_selected"]
    change_form_template = "admin/durable_agents/run/change_form.html"
    change_list_template = "admin/durable_agents/run/change_list.html"
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "run_id",
                    "agent",
                    "run_status",
                    "session_id",
                    "turns",
                    "answer",
                    "input_pretty",
                    "attempts",
                    "last_error_pretty",
                ]
            },
        ),
        ("Cost", {"fields": ["usage_pretty", "spend_pretty"]}),
        (
            "Lineage",
            {
                "classes": ["collapse"],
                "fields": [
                    "parent_run_id",
                    "root_run_id",
                    "forked_from",
                    "forked_step",
                    "fingerprint_pretty",
                ],
            },
        ),
        ("Times", {"fields": ["created_at", "updated_at", "finished_at", "dispatched_at"]}),
    ]
    readonly_fields = [str(f) for _, group in fieldsets for f in group["fields"]]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Run]:
        rows: QuerySet[Run] = (
            super()
            .get_queryset(request)
            .annotate(
                # A root counts what waits in its sub-runs too: it waits on them.
                n_pending_approvals=in_tree_count(ApprovalRequest, status=APPROVAL_PENDING),
                n_open_halts=in_tree_count(Halt, status=HALT_OPEN),
            )
        )
        return rows

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> Any:
        return RunChangeList

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_view_permission(request, obj) or allows(request, "view_runs")

    def has_module_permission(self, request: HttpRequest) -> bool:
        allowed = super().has_module_permission(request)
        if allowed and self.has_view_permission(request):
            health.warn_on_index(request)  # staff who see runs see queue health
        if allowed:
            counts.note_on_index(request)
        return allowed

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return AnyModelAdmin.has_delete_permission(self, request, obj)

    # The actions' ``permissions=[...]`` name these (Django asks ``has_<name>_permission``).
    def has_resume_run_permission(self, request: HttpRequest) -> bool:
        return allows(request, "resume")

    def has_cancel_run_permission(self, request: HttpRequest) -> bool:
        return allows(request, "cancel")

    def get_urls(self) -> list[URLPattern]:
        # The admin's "<object_id>/" (a redirect to the change page) would swallow
        # "compare/" and "sessions/<id>/", so those go before it. A run's own pages
        # ("<object_id>/change/" …) go before the session page, so a run named "sessions"
        # still opens; a session named "change" (or "history", "delete", "resume", "cancel",
        # "fork", "events") has no page of its own.
        own = super().get_urls()
        catch_all = [u for u in own if str(u.pattern) == "<path:object_id>/"]
        return [
            self.command_path("compare", forks.compare_view, "compare/"),
            self.command_path("sessions", sessions.sessions_view, "sessions/"),
            self.command_path("waiting", waits.waiting_view, "waiting/"),
            self.command_path("answer", waits.answer_view, "<path:object_id>/answer/<str:name>/"),
            self.command_path("wake", waits.wake_view, "<path:object_id>/wake/<str:name>/"),
            self.command_path("resume", run_resume_view),
            self.command_path("cancel", run_cancel_view),
            self.command_path("fork", forks.fork_view),
            self.command_path("export", run_export_view),
            self.command_path("verify", run_verify_view),
            self.command_path("events", live.run_events_view),
            *[u for u in own if u not in catch_all],
            self.command_path("session", sessions.session_view, "sessions/<str:session_id>/"),
            *catch_all,
        ]

    @admin.display(description="status", ordering="status")
    def status_pill(self, obj: Any) -> str:
        return status_pill(obj.status)

    @admin.display(description="status")
    def run_status(self, obj: Any) -> str:
        """The run page's status, as the same pill as the lists'."""
        return status_pill(obj.status)

    @admin.display(description="pending approvals", ordering="n_pending_approvals")
    def pending_approvals(self, obj: Any) -> int:
        return int(obj.n_pending_approvals)

    @admin.display(description="open halts", ordering="n_open_halts")
    def open_halts(self, obj: Any) -> int:
        return int(obj.n_open_halts)

    @admin.display(description="input excerpt")
    def input_excerpt(self, obj: Any) -> str:
        return excerpt(getattr(obj, "input_head", None), json_text=True)

    @admin.display(description="answer excerpt")
    def answer_excerpt(self, obj: Any) -> str:
        return excerpt(getattr(obj, "answer_head", None))

    @admin.display(description="waits for", ordering="-n_pending_approvals")
    def waits_for(self, obj: Any) -> str:
        """What the run waits on: people (approvals and halts, its sub-runs' included for a
        root), then the world (an answer, a signal, a timer, a message). An inert import
        waits on nobody: it is evidence."""
        if obj.imported == IMPORTED_INERT:
            return format_html('<span class="da-imported">{}</span>', "imported evidence")
        people = [
            f"{n} {what}{'s' if n != 1 else ''}"
            for n, what in (
                (int(obj.n_pending_approvals), "approval"),
                (int(obj.n_open_halts), "open halt"),
            )
            if n
        ]
        world = getattr(obj, "waiting_for", "")
        if not people and not world:
            return "-"
        return format_html(
            "{}{}",
            format_html('<strong class="da-waits-people">{}</strong>', ", ".join(people))
            if people
            else "",
            format_html('<div class="da-cell-line">{}</div>', world) if world else "",
        )

    @admin.display(description="run", ordering="-updated_at")
    def run_cell(self, obj: Any) -> str:
        """The run (a link to its page), its agent and when it last changed."""
        return format_html(
            '<a href="{}">{}</a><div class="da-cell-line">{} · {}</div>',
            run_url(self, obj.run_id),
            obj.run_id,
            obj.agent,
            f"{timezone.localtime(obj.updated_at):%Y-%m-%d %H:%M}" if obj.updated_at else "",
        )

    @admin.display(description="input")
    def input_pretty(self, obj: Run) -> str:
        return json_cell(obj.input)

    @admin.display(description="last error")
    def last_error_pretty(self, obj: Run) -> str:
        return json_cell(obj.last_error) if obj.last_error else "-"

    @admin.display(description="usage")
    def usage_pretty(self, obj: Run) -> str:
        return json_cell(obj.usage)

    @admin.display(description="spend")
    def spend_pretty(self, obj: Run) -> str:
        return json_cell(obj.spend)

    @admin.display(description="fingerprint")
    def fingerprint_pretty(self, obj: Run) -> str:
        return json_cell(obj.fingerprint)

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> Any:
        if obj is not None:
            context.update(run_context(self, request, obj))
            context.update(forks.lineage(self, obj))
            context.update(tree.tree(self, obj))
        return super().render_change_form(request, context, add, change, form_url, obj)

    @admin.action(description="Resume selected runs", permissions=["resume_run"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        ids = list(queryset.values_list("run_id", flat=True))
        done, refused = resume_runs(request, ids)
        report(request, "Handed to a driver", done, refused)

    @admin.action(description="Cancel selected runs", permissions=["cancel_run"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        ids = list(queryset.values_list("run_id", flat=True))
        done, refused = cancel_runs(request, ids, "cancelled in the admin")
        report(request, "Cancelled", done, refused)

    # Deleting a run removes its journal, lease, approvals and halts; the ActionLog row the
    # engine's delete command writes in the same transaction as the delete stays (it is
    # keyed by run id only).

    def delete_model(self, request: HttpRequest, obj: Run) -> None:
        delete(obj.run_id, by=admin_actor(request), via="admin")

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        who = admin_actor(request)
        gone: set[str] = set()
        # Runs above their sub-runs, so that each sub-run selected with its root goes with it
        # (and is logged there) rather than alone.
        rows = sorted(
            queryset.values_list("run_id", "parent_run_id"),
            key=lambda row: (row[1] is not None, len(row[0])),
        )
        for run_id, _ in rows:
            if run_id not in gone:
                gone.update(delete(run_id, by=who, via="admin"))

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        """A summary instead of every journal entry; and only ``delete_run`` is needed, since
        the rows that go with a run cannot be deleted on their own."""
        runs = list(objs)
        ids = [r.pk for r in runs]
        counts = reads.rows_of_runs(ids)
        summary = [
            f"Run: {run.run_id} ({', '.join(f'{c.get(run.pk, 0)} {k}' for k, c in counts.items())})"
            for run in runs
        ]
        # The sub-runs below each go with it (``commands.runs.delete``): say so before.
        below = {rid for run in runs for rid in reads.runs_below(run.run_id)} - set(ids)
        if below:
            summary.append(f"Sub-runs below them, which go with them: {', '.join(sorted(below))}")
        model_count = {str(Run._meta.verbose_name_plural): len(runs) + len(below)}
        model_count.update({k: sum(c.values()) for k, c in counts.items()})
        return summary, model_count, set(), []


# -- the run page ------------------------------------------------------------------------


def run_context(admin: AnyModelAdmin, request: HttpRequest, run: Any) -> dict[str, Any]:
    """Everything the run page shows beyond its fields (lineage: ``forks.lineage``)."""
    timeline_error = None
    records: list[Record] = []
    try:
        records = reads.journal(run.run_id)
    except DurableAgentsError as exc:
        timeline_error = str(exc)
    # An inert import is evidence: shown whole, with nothing on it to act on (no queue
    # page for its requests and halts, no answer, wake, resume, cancel or fork).
    inert = run.imported == IMPORTED_INERT
    can_fork = allows(request, "fork") and bool(records) and not inert
    approvals = [
        {
            "obj": a,
            "url": None
            if inert
            else reverse("admin:durable_agents_approvalrequest_change", args=[a.pk]),
        }
        for a in run.approval_requests.order_by("created_at")
    ]
    halts = [
        {
            "obj": h,
            "url": None if inert else reverse("admin:durable_agents_halt_change", args=[h.pk]),
        }
        for h in run.halts.order_by("created_at")
    ]
    return {
        "imported": _imported_panel(run),
        "waits": {} if inert else waits.waits_of_run(admin, request, run, records),
        # What waits on a person here and in the sub-runs below, first on the page: the
        # inbox's cards (the same rendering, folding and forms).
        "needed_cards": [] if inert else banner_cards(admin, request, run),
        "awaiting_approval": run.status == AWAITING_APPROVAL,
        "timeline": build_timeline(records, [h["obj"] for h in halts]),
        "timeline_error": timeline_error,
        **agent_drift(records, fallback=run.fingerprint),
        "fork_url": admin_url(admin, "fork", quote(run.run_id)) if can_fork else None,
        "lease": reads.lease(run.run_id),
        "action_log": [
            {"row": a, "payload": json.dumps(a.payload, ensure_ascii=False, default=str)}
            for a in ActionLog.objects.filter(run_id=run.run_id)[:200]
        ],
        "run_approvals": approvals,
        "run_halts": halts,
        "can_operate": allows(request, "cancel") and not inert,
        "run_finished": run.status in TERMINAL_STATUSES,
        "resume_url": admin_url(admin, "resume", quote(run.run_id)),
        "cancel_url": admin_url(admin, "cancel", quote(run.run_id)),
        # "Cancel and compensate": an agent with undos, whose run is not rolling back yet.
        "can_compensate": _has_undos(run.agent) and not saga_aborted(records),
        "export_url": admin_url(admin, "export", quote(run.run_id)),
        "verify_url": admin_url(admin, "verify", quote(run.run_id)),
    }


def _imported_panel(run: Any) -> dict[str, Any] | None:
    """Where an imported run came from, and whether its chain is vouched for."""
    if not run.imported:
        return None
    found = RunImport.objects.filter(run_id=run.run_id).first()
    trust = reads.import_trust(run.run_id)
    return {
        "inert": run.imported == IMPORTED_INERT,
        "row": found,
        "trusted": bool(trust and trust.trusted),
        "why": trust.why if trust is not None else "",
    }


def _has_undos(agent_name: str) -> bool:
    try:
        agent = get_agent(agent_name)
    except DurableAgentsError:
        return False
    return sagas.has_undos(agent)  # its sub-agents' undos count: the tree rolls back


# -- resume and cancel ------------------------------------------------------------------


def resume_runs(request: HttpRequest, run_ids: Iterable[str]) -> tuple[list[str], list[str]]:
    """Hand unfinished runs to a driver (the engine's ``hand_over``, which logs each);
    returns (resumed, refused)."""
    resumed, refused = [], []
    for run_id in run_ids:
        run = reads.run_info(run_id)
        if run is None or run.status in TERMINAL_STATUSES:
            refused.append(f"{run_id} ({'deleted' if run is None else run.status})")
            continue
        try:
            with deferred() as late:
                hand_over(run_id, by=admin_actor(request), via="admin")
        except DurableAgentsError as exc:  # its state moved on since it was read
            refused.append(f"{run_id}: {exc}")
            continue
        if late:  # logged; only the message to a worker failed: the broker is unreachable
            then = BY_RECOVERY if run.status in (QUEUED, RUNNING) else BY_RESUME
            not_handed_over(request, f"The resume of run {run_id} is logged", late[0].error, then)
            continue
        resumed.append(run_id)
    return resumed, refused


def cancel_runs(
    request: HttpRequest, run_ids: Iterable[str], reason: str, *, compensate: bool = False
) -> tuple[list[str], list[str]]:
    done, refused = [], []
    for run_id in run_ids:
        try:
            cancel(run_id, by=admin_actor(request), reason=reason, compensate=compensate)
        except DurableAgentsError as exc:
            refused.append(f"{run_id}: {exc}")
        else:
            done.append(run_id)
    return done, refused


def report(request: HttpRequest, verb: str, done: list[str], refused: list[str]) -> None:
    if done:
        messages.success(request, f"{verb}: {', '.join(done)}")
    for why in refused:
        messages.error(request, f"Not {verb.lower()}: {why}")


def run_resume_view(admin: AnyModelAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    run = posted_object(admin, request, object_id, "resume")
    if isinstance(run, HttpResponse):
        return run
    done, refused = resume_runs(request, [run.run_id])
    report(request, "Handed to a driver", done, refused)
    return HttpResponseRedirect(run_url(admin, run.run_id))


def run_cancel_view(admin: AnyModelAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    run = posted_object(admin, request, object_id, "cancel")
    if isinstance(run, HttpResponse):
        return run
    reason = str(request.POST.get("reason") or "").strip()[:1000]
    compensate = "compensate" in request.POST
    done, refused = cancel_runs(
        request, [run.run_id], reason or "cancelled in the admin", compensate=compensate
    )
    report(
        request,
        "Cancelled; undoing its completed calls" if compensate else "Cancelled",
        done,
        refused,
    )
    return HttpResponseRedirect(run_url(admin, run.run_id))


def run_verify_view(admin: AnyModelAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    """The run's audit check (docs/audit.md), for anyone who may view it: its journal's hash
    chain recomputed from the stored rows, the site's action-log chain, and the run's head
    signed with the site's key when ``AUDIT_SIGNING_KEY`` is set."""
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET"])
    run = admin.get_object(request, unquote(object_id))
    if run is None or not admin.has_view_permission(request, run):
        return object_gone(admin, request, object_id)
    chain, actions = reads.verify([run.run_id], actions=True)
    head = reads.sign_head(run.run_id) if chain.ok else None
    return page(
        admin,
        request,
        "admin/durable_agents/run/verify.html",
        f"Verify run {run.run_id}",
        {
            "original": run,
            "run_url": run_url(admin, run.run_id),
            "chain": chain,
            "actions": actions,
            "head": head,
        },
    )


def run_export_view(admin: AnyModelAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    """The run as JSON lines (docs/replay.md), for anyone who may view it."""
    if request.method != "GET":
        return HttpResponseNotAllowed(["GET"])
    run = admin.get_object(request, unquote(object_id))
    if run is None or not admin.has_view_permission(request, run):
        return object_gone(admin, request, object_id)
    body = "".join(f"{text}\n" for text in export_lines(run.run_id))
    response = HttpResponse(body, content_type="application/x-ndjson; charset=utf-8")
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in run.run_id)
    response["Content-Disposition"] = f'attachment; filename="{safe}.jsonl"'
    return response
