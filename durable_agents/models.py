"""Rows. The journal (``JournalEntry``) is the truth; ``Run`` is a projection the engine
keeps in step with it. Rows convert to frozen domain objects (``Run.to_domain()``) so the
engine never sees a model instance.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models.functions import Now

from .engine import ports
from .permissions import MODEL_PERMISSIONS

RUN_ID_LENGTH = 400


class Run(models.Model):
    STATUS_CHOICES = [(s, s.replace("_", " ")) for s in ports.STATUSES]
    KIND_CHOICES = [(k, k) for k in ports.RUN_KINDS]

    run_id = models.CharField(primary_key=True, max_length=RUN_ID_LENGTH)
    agent = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(max_length=32, choices=STATUS_CHOICES, default=ports.QUEUED)
    input = models.JSONField(null=True, blank=True)
    answer = models.TextField(null=True, blank=True)
    usage = models.JSONField(default=dict, blank=True)
    spend = models.JSONField(default=dict, blank=True)
    turns = models.PositiveIntegerField(default=0)
    last_error = models.JSONField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0, help_text="failures in a row")
    fingerprint = models.JSONField(null=True, blank=True)
    session_id = models.CharField(max_length=200, null=True, blank=True, db_index=True)
    parent_run_id = models.CharField(max_length=RUN_ID_LENGTH, null=True, blank=True)
    root_run_id = models.CharField(max_length=RUN_ID_LENGTH, null=True, blank=True)
    forked_from = models.CharField(max_length=RUN_ID_LENGTH, null=True, blank=True)
    forked_step = models.IntegerField(null=True, blank=True)
    kind = models.CharField(
        max_length=16,
        choices=KIND_CHOICES,
        default=ports.KIND_AGENT,
        db_default=ports.KIND_AGENT,
        help_text="only agent runs are driven; a session's journal or a plain journal never is",
    )
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)
    dispatched_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="when recovery last handed the run to a driver; it waits an interval "
        "before sending it again",
    )
    imported = models.CharField(
        max_length=8,
        blank=True,
        default=ports.NOT_IMPORTED,
        db_default=ports.NOT_IMPORTED,
        choices=[
            (ports.NOT_IMPORTED, "made here"),
            (ports.IMPORTED_INERT, "imported as evidence (inert)"),
            (ports.IMPORTED_LIVE, "imported live (decisions verified)"),
        ],
        help_text="set by an import, never changed: an inert import is never driven nor "
        "decided (docs/replay.md, 'Imports')",
    )

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # Recovery and `pending()` read unfinished runs only; a partial index keeps that
            # read independent of how many runs have finished.
            models.Index(
                fields=["run_id"],
                name="da_run_unfinished",
                condition=models.Q(finished_at__isnull=True),
            ),
            models.Index(fields=["status", "-created_at"], name="da_run_status"),
            models.Index(fields=["agent", "-created_at"], name="da_run_agent"),
            # The runs list (admin and API), newest first, and its keyset pages: the run id
            # breaks ties, as both lists order by it (migration 0016).
            models.Index(fields=["-created_at", "-run_id"], name="da_run_created"),
            # The run page's tree (``subtree``, the list's in-tree counts) and lineage
            # (its forks): partial, as most runs are neither sub-runs nor forks, and these
            # columns never change once written, so updates of a run stay HOT.
            models.Index(
                fields=["root_run_id"],
                name="da_run_root",
                condition=models.Q(root_run_id__isnull=False),
            ),
            models.Index(
                fields=["forked_from"],
                name="da_run_forked",
                condition=models.Q(forked_from__isnull=False),
            ),
        ]
        permissions = [*MODEL_PERMISSIONS]

    def __str__(self) -> str:
        return self.run_id

    def to_domain(self) -> ports.RunInfo:
        return ports.RunInfo(
            run_id=self.run_id,
            agent=self.agent,
            status=self.status,
            input=self.input,
            answer=self.answer,
            usage=self.usage or {},
            spend=self.spend or {},
            turns=self.turns,
            last_error=self.last_error,
            attempts=self.attempts,
            fingerprint=self.fingerprint,
            session_id=self.session_id,
            parent_run_id=self.parent_run_id,
            root_run_id=self.root_run_id,
            forked_from=self.forked_from,
            forked_step=self.forked_step,
            kind=self.kind,
            created_at=self.created_at,
            updated_at=self.updated_at,
            finished_at=self.finished_at,
            dispatched_at=self.dispatched_at,
            imported=self.imported,
        )


class RunImport(models.Model):
    """How a run came to this site from an export (``durable_agents.transfer``): who
    imported it, the file's digest, and the evidence the file carried that this site does
    not take as its own: the head signature it stated (``audit.verify`` trusts it only under
    a key in ``TRUSTED_AUDIT_KEYS``) and its action-log rows, kept here as exported rather
    than joined to the site's action-log chain. Written once, with the run."""

    run = models.OneToOneField(
        Run, on_delete=models.CASCADE, primary_key=True, related_name="import_record"
    )
    live = models.BooleanField(default=False)
    imported_at = models.DateTimeField(db_default=Now())
    imported_by = models.CharField(max_length=200)
    imported_by_id = models.CharField(max_length=64, blank=True, default="")
    file_digest = models.CharField(max_length=64, help_text="sha256 of the export file, hex")
    exported_at = models.CharField(max_length=64, blank=True, default="")
    library = models.CharField(max_length=64, blank=True, default="", help_text="exporter's")
    # The chain head the file stated for this run, and its signature when the exporting
    # site signed it (``head_message``; base64 Ed25519 signature and public key).
    head = models.CharField(max_length=64, null=True, blank=True)
    records = models.PositiveIntegerField(default=0, help_text="records the file held")
    head_signature = models.TextField(null=True, blank=True)
    public_key = models.CharField(max_length=100, null=True, blank=True)
    # The run's action-log rows as the file carried them (with their hash and the hash
    # before each): evidence of what another site logged, not rows of this site's log.
    actions = models.JSONField(default=list, blank=True)

    class Meta:
        verbose_name = "run import"

    def __str__(self) -> str:
        return f"{self.run_id} imported {'live' if self.live else 'inert'} by {self.imported_by}"


class JournalEntry(models.Model):
    """One recorded step. Append-only: rows are never updated, and deleted only with their run."""

    seq = models.BigAutoField(primary_key=True)
    # No database-level foreign key: the fenced insert already proves the run exists (its
    # lease row references it), and the constraint check would cost every step a lookup.
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="entries", db_index=False, db_constraint=False
    )
    name = models.CharField(max_length=500)
    # Canonical JSON text, kept as text (not jsonb) so it comes back byte for byte.
    data = models.TextField()
    created_at = models.DateTimeField(db_default=Now())
    # The audit chain (docs/audit.md): sent by a driver that knows its run's last record,
    # else set by a database trigger on insert. Null on records written before the chain
    # existed (a run's unchained prefix).
    hash = models.CharField(max_length=64, null=True, blank=True, editable=False)
    # The seq of the run's record before this one (PostgreSQL; null on a run's first
    # record, on SQLite and on records older than migration 0012). Unique: a record has at
    # most one successor, so two writers that both took the same record for the last cannot
    # both append (docs/audit.md). Not hashed.
    prev_seq = models.BigIntegerField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "name"], name="da_journal_run_name"),
            models.UniqueConstraint(fields=["prev_seq"], name="da_journal_prev_seq"),
        ]
        indexes = [models.Index(fields=["run", "seq"], name="da_journal_run_seq")]
        verbose_name_plural = "journal entries"

    def __str__(self) -> str:
        return f"{self.run_id}:{self.name}"


class Lease(models.Model):
    """Who drives a run, until when (by the database clock). The token fences every write."""

    # No database constraint: every lease statement checks its run exists anyway, and the
    # constraint's check at commit locked the run row on every lease taken (issue 17).
    run = models.OneToOneField(Run, on_delete=models.CASCADE, primary_key=True, db_constraint=False)
    holder = models.CharField(max_length=200)
    token = models.CharField(max_length=64)
    expires_at = models.DateTimeField()
    renewed_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.run_id} held by {self.holder}"


class RunTrace(models.Model):
    """Where a run was started from, as W3C trace context (``traceparent``, ``tracestate``):
    written when the run is created with ``DURABLE_AGENTS["TELEMETRY"]`` on, so every drive
    of it, in any process and however much later, links its span back there
    (docs/telemetry.md). No row: telemetry was off when it started, or nothing was traced."""

    # No database constraint: written beside the run's creating statement, never checked
    # against it; deleting the run deletes it (the ORM's cascade).
    run = models.OneToOneField(
        Run, on_delete=models.CASCADE, primary_key=True, db_constraint=False, related_name="+"
    )
    traceparent = models.CharField(max_length=55)
    tracestate = models.CharField(max_length=512, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())

    def __str__(self) -> str:
        return f"{self.run_id} started in {self.traceparent}"


class Follower(models.Model):
    """Someone following a run live (``durable_agents.database.events``), until
    ``expires_at`` by the database clock. Only a run with an unexpired follower notifies on
    its writes: a notifying transaction serialises its commit with every other one on the server
    (docs/events.md). Written by the follower alone: registered before it first reads,
    refreshed while it follows, deleted when it stops; a crashed follower's row expires."""

    run_id = models.CharField(max_length=RUN_ID_LENGTH)
    expires_at = models.DateTimeField()

    class Meta:
        indexes = [
            # The triggers' probe: one lookup per journal insert or status change.
            models.Index(fields=["run_id"], name="da_follower_run"),
            # Registering sweeps the expired rows of crashed followers.
            models.Index(fields=["expires_at"], name="da_follower_expiry"),
        ]

    def __str__(self) -> str:
        return f"follower of {self.run_id}"


class Halt(models.Model):
    """A run stopped on an operation whose outcome is unknown (a crash mid-effect, or a
    contended claim), or on a call whose approval request expired with
    ``on_expiry="halt"``. Staff record what really happened (or what the call's result is);
    the run then continues."""

    CAUSES = [
        (ports.HALT_CRASHED, "crashed"),
        (ports.HALT_CONTENDED, "contended"),
        (ports.HALT_OUTCOME_UNKNOWN, "the tool could not tell"),
        (ports.HALT_EXPIRED, "its approval request expired"),
    ]
    STATUSES = [
        (ports.HALT_OPEN, "open"),
        (ports.HALT_RESOLVED, "resolved"),
        (ports.HALT_ORPHANED, "orphaned"),
    ]

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="halts")
    op_id = models.CharField(max_length=500, help_text="tool call id or step name")
    tool_name = models.CharField(max_length=200, blank=True, default="")
    arguments = models.JSONField(null=True, blank=True)
    attempt = models.CharField(max_length=600, blank=True, default="")
    attempted_at = models.DateTimeField(null=True, blank=True)
    cause = models.CharField(max_length=16, choices=CAUSES, default="crashed")
    # What the tool said when it raised ToolOutcomeUnknown: {"type": ..., "message": ...}.
    reason = models.JSONField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=STATUSES, default=ports.HALT_OPEN)
    resolution = models.JSONField(null=True, blank=True)
    resolved_by = models.CharField(max_length=200, null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # One row per attempt: a stale driver saving the same halt again cannot reopen a
            # resolved one or erase its resolution.
            models.UniqueConstraint(
                fields=["run", "op_id", "attempt"], name="da_halt_run_op_attempt"
            ),
        ]
        indexes = [models.Index(fields=["status", "-created_at"], name="da_halt_status")]

    def __str__(self) -> str:
        return f"{self.run_id}: {self.tool_name or self.op_id} ({self.status})"

    def to_domain(self) -> ports.HaltInfo:
        return ports.HaltInfo(
            run_id=self.run_id,
            op_id=self.op_id,
            tool_name=self.tool_name,
            arguments=self.arguments,
            attempt=self.attempt,
            attempted_at=self.attempted_at,
            cause=self.cause,
            reason=self.reason,
            status=self.status,
            resolution=self.resolution,
            resolved_by=self.resolved_by,
            created_at=self.created_at,
            resolved_at=self.resolved_at,
        )


class ApprovalRequest(models.Model):
    """A gated tool call waiting for staff. The decision that counts is journaled too."""

    STATUSES = [
        (ports.APPROVAL_PENDING, "pending"),
        (ports.APPROVAL_APPROVED, "approved"),
        (ports.APPROVAL_DENIED, "denied"),
        (ports.APPROVAL_WITHDRAWN, "withdrawn"),
        (ports.APPROVAL_EXPIRED, "expired"),
    ]

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approval_requests")
    call_id = models.CharField(max_length=500)
    tool_name = models.CharField(max_length=200)
    arguments = models.JSONField(null=True, blank=True)
    policy = models.JSONField(default=dict)
    start_seq = models.BigIntegerField(help_text="which start of the run asked")
    status = models.CharField(max_length=16, choices=STATUSES, default=ports.APPROVAL_PENDING)
    previous_arguments = models.JSONField(
        null=True,
        blank=True,
        help_text="arguments approved earlier that today's code would run differently",
    )
    tool_digest = models.CharField(
        max_length=64,
        blank=True,
        default="",
        # Rows written by SQL of their own (a bulk load, an older process mid-deploy) too.
        db_default="",
        help_text="for an MCP server's tool, its definition when the call was asked",
    )
    created_at = models.DateTimeField(db_default=Now())
    decided_at = models.DateTimeField(null=True, blank=True)
    # When the request's next deadline step falls due (remind, escalate, expire: the
    # policy's ``deadline`` counted from ``created_at``); null when none is left. The timer
    # sweep reads pending requests by it.
    due_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["run", "call_id"], name="da_approval_run_call"),
        ]
        indexes = [
            models.Index(fields=["status", "-created_at"], name="da_approval_status"),
            models.Index(
                fields=["due_at"],
                name="da_approval_due",
                condition=models.Q(status=ports.APPROVAL_PENDING, due_at__isnull=False),
            ),
            # The notification outbox's reconciling pass reads requests decided (or
            # expired) lately by it (``notifications.outbox``): never the whole history.
            models.Index(
                fields=["-decided_at"],
                name="da_approval_decided",
                condition=models.Q(decided_at__isnull=False),
            ),
        ]
        verbose_name = "tool call awaiting approval"
        verbose_name_plural = "tool calls awaiting approval"

    def __str__(self) -> str:
        return f"{self.tool_name} in {self.run_id}"

    def to_domain(self) -> ports.ApprovalRequestInfo:
        return ports.ApprovalRequestInfo(
            run_id=self.run_id,
            call_id=self.call_id,
            tool_name=self.tool_name,
            arguments=self.arguments,
            policy=self.policy or {},
            start_seq=self.start_seq,
            status=self.status,
            created_at=self.created_at,
            decided_at=self.decided_at,
            previous_arguments=self.previous_arguments,
            due_at=self.due_at,
            tool_digest=self.tool_digest,
        )


class Inbox(ApprovalRequest):
    """No table of its own: the admin's inbox page (``/admin/durable_agents/inbox/``), one
    card per thing waiting on a person (calls awaiting approval, questions, halts). A proxy
    so the admin lists it with the app's models and serves it under the app's URL."""

    class Meta:
        proxy = True
        verbose_name = "inbox"
        verbose_name_plural = "inbox"


class Decision(models.Model):
    """One approver's decision on one request: a user counts once."""

    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="decisions")
    approver = models.CharField(max_length=200)
    approved = models.BooleanField()
    note = models.TextField(blank=True, default="")
    signature = models.TextField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    # An approval's edited arguments (what it approves running instead); null: as asked.
    arguments = models.JSONField(null=True, blank=True)
    # Who made it, when a deputy decided for ``approver`` (``Delegation``); "" for the
    # approver themselves. The approver counts once, whoever decided for them.
    deputy = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(fields=["request", "approver"], name="da_decision_once"),
        ]

    def __str__(self) -> str:
        return f"{self.approver}: {'approve' if self.approved else 'deny'}"


class Notification(models.Model):
    """The outbox: one message about one fact of an approval request (it waits, was
    reminded, escalated, expired or decided) for one channel. Unique per (request, asked,
    event, channel), so a fact notifies each channel once whatever retries, crashes or
    reconciling passes wrote it; delivered at least once, with backoff, by
    ``notifications.delivery.deliver``. ``payload`` is what is sent, rendered when the row was
    written; ``delivery_id`` names the row to the receiver, the same on every try."""

    PENDING, SENT, FAILED = "pending", "sent", "failed"
    STATUSES = [(PENDING, "pending"), (SENT, "sent"), (FAILED, "failed (given up)")]

    delivery_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    request = models.ForeignKey(
        ApprovalRequest, on_delete=models.CASCADE, related_name="notifications"
    )
    # "" the first time a call is asked; the arguments' tag (``approvals.arguments_tag``)
    # when it is asked again about others: a new request, told again.
    asked = models.CharField(max_length=32, blank=True, default="")
    event = models.CharField(max_length=32)  # engine.events: approval_requested, …
    channel = models.CharField(max_length=64)  # the channel's name in NOTIFY["CHANNELS"]
    status = models.CharField(max_length=16, choices=STATUSES, default=PENDING)
    attempts = models.PositiveIntegerField(default=0)
    # When the delivery pass may try it next (by the database clock); null once it is sent
    # or given up.
    next_attempt_at = models.DateTimeField(null=True, blank=True, db_default=Now())
    last_error = models.TextField(blank=True, default="")
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(db_default=Now())
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["request", "asked", "event", "channel"], name="da_notification_once"
            ),
        ]
        indexes = [
            # The delivery pass: a channel's due rows, the longest due first.
            models.Index(
                fields=["channel", "next_attempt_at"],
                name="da_notification_due",
                condition=models.Q(status="pending"),
            ),
            # The admin's list of failed and pending notifications, newest first.
            models.Index(fields=["status", "-created_at"], name="da_notification_status"),
        ]

    def __str__(self) -> str:
        return f"{self.event} to {self.channel} ({self.status})"


class ActionLog(models.Model):
    """Who did what: every staff or API action on a run. Append-only; kept when a run is
    deleted (the run id is a plain column, not a foreign key)."""

    actor = models.CharField(max_length=200)
    actor_id = models.CharField(
        max_length=64, blank=True, default="", help_text="the user's primary key (stable)"
    )
    channel = models.CharField(
        max_length=300,
        blank=True,
        default="",
        help_text="how the request came: admin, session, api-key:<prefix>, signature via "
        "<relay>, command, python",
    )
    action = models.CharField(max_length=32)
    run_id = models.CharField(max_length=RUN_ID_LENGTH, db_index=True)
    target = models.CharField(max_length=500, blank=True, default="")
    payload = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    # The site-wide audit chain (docs/audit.md), set by ``DjangoStore.log_action``.
    hash = models.CharField(max_length=64, null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["-created_at"], name="da_action_time")]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} {self.run_id}"


class ApiKey(models.Model):
    """An API key of one user, acting as that user; only its hash is stored. Created by its
    owner for themselves, it is confirmed at once. A superuser may invite one for someone
    else (``created_by`` says who did): the row then holds no secret at all (empty
    ``prefix`` and ``key_hash``) until its owner confirms it in their own session, which
    generates the raw key and shows it to the owner once (``durable_agents.people_keys``). It may
    expire, records its last use, and is refused from the moment it is revoked."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="durable_agents_api_keys"
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, db_index=True)
    key_hash = models.CharField(max_length=128)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="who created the key (its owner, or a superuser)",
    )
    created_at = models.DateTimeField(db_default=Now())
    confirmed_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="when its owner confirmed it; empty: pending, it authenticates nothing",
    )
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="refused from this moment on; empty: never expires"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class ApproverKey(models.Model):
    """An Ed25519 public key one user signs decisions with. It belongs to that user (a
    foreign key, not a name), and a public key belongs to one user only. Registered by its
    owner, it is confirmed at once; registered by someone else, it is pending and verifies
    nothing until the owner, signed in as themselves, signs a challenge with its private key
    (``KeyChallenge``)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="durable_agents_approver_keys",
        help_text="the approver: decisions signed with this key are theirs",
    )
    public_key = models.CharField(
        max_length=100, unique=True, help_text="raw 32-byte Ed25519 public key, base64"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="who registered the key (its owner, or a superuser)",
    )
    created_at = models.DateTimeField(db_default=Now())
    confirmed_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="when its owner proved they hold the private key; empty: pending, it "
        "verifies nothing",
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"key {self.public_key[:12]}… of user #{self.user_id}"


class KeyChallenge(models.Model):
    """A random challenge the owner of a pending approver key signs to confirm it: bound to
    the key and the user it was issued to, used once, refused after ``expires_at``."""

    key = models.ForeignKey(ApproverKey, on_delete=models.CASCADE, related_name="challenges")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    nonce = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"challenge for key #{self.key_id}"


class Tombstone(models.Model):
    """What is left of a run ``prune`` deleted (``durable_agents.database.retention``): its final
    chain head and record count, when and by whom it was pruned, and the sha256 of the
    export file that holds it, signed with the site's ``AUDIT_SIGNING_KEY`` when one is set
    (``engine.audit.tombstone_message``). ``verify`` reports a pruned run by it. Written in
    the transaction that deletes the run; never changed."""

    run_id = models.CharField(max_length=RUN_ID_LENGTH, db_index=True)
    agent = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(max_length=32)
    root_run_id = models.CharField(max_length=RUN_ID_LENGTH, null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    head = models.CharField(max_length=64, null=True, blank=True)
    records = models.PositiveIntegerField(default=0)
    unchained = models.PositiveIntegerField(default=0)
    pruned_at = models.DateTimeField()
    pruned_by = models.CharField(max_length=200)
    pruned_by_id = models.CharField(max_length=64, blank=True, default="")
    export_file = models.CharField(max_length=500, blank=True, default="")
    export_sha256 = models.CharField(
        max_length=64, blank=True, default="", help_text="sha256 of the export file, hex"
    )
    signature = models.TextField(null=True, blank=True)
    public_key = models.CharField(max_length=100, null=True, blank=True)

    class Meta:
        ordering = ["-pruned_at", "-id"]
        indexes = [models.Index(fields=["-pruned_at"], name="da_tombstone_time")]

    def __str__(self) -> str:
        return f"{self.run_id} pruned by {self.pruned_by}"


class Delegation(models.Model):
    """``deputy`` decides for ``approver`` from ``starts_at`` to ``ends_at`` (on the
    database's clock), for every call or only those of ``groups``/``tools`` (empty: all):
    the approver who is away this week. Recorded and revoked through
    ``engine.commands.delegations``, each logged; never edited."""

    approver = models.CharField(max_length=200)
    deputy = models.CharField(max_length=200)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    groups = models.JSONField(default=list, blank=True)
    tools = models.JSONField(default=list, blank=True)
    note = models.TextField(blank=True, default="")
    created_by = models.CharField(max_length=200)
    created_at = models.DateTimeField(db_default=Now())
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["-starts_at", "-id"]
        indexes = [
            models.Index(fields=["deputy", "ends_at"], name="da_delegation_deputy"),
            models.Index(fields=["approver", "ends_at"], name="da_delegation_approver"),
        ]

    def __str__(self) -> str:
        return f"{self.deputy} for {self.approver}"


class SpentRunId(models.Model):
    """A run id this site held and deleted (``engine.spent``): no run is created under it
    again. Written in the transaction that deletes the run (``delete``, ``prune``); never
    changed or deleted."""

    run_id = models.CharField(primary_key=True, max_length=RUN_ID_LENGTH)
    reason = models.CharField(max_length=16)  # engine.spent.REASONS
    spent_at = models.DateTimeField(db_default=Now())

    def __str__(self) -> str:
        return f"{self.run_id} ({self.reason})"


class SpentDecision(models.Model):
    """A signed decision of a run this site deleted, by the sha256 of its signature: a live
    import carrying it is refused (docs/replay.md, "Imports"), so one signed decision
    authorises at most the firing it was given for. Written with ``SpentRunId``."""

    digest = models.CharField(primary_key=True, max_length=64)  # sha256 of the signature, hex
    run_id = models.CharField(max_length=RUN_ID_LENGTH)
    call_id = models.CharField(max_length=500)
    approver = models.CharField(max_length=200)
    spent_at = models.DateTimeField(db_default=Now())

    def __str__(self) -> str:
        return f"{self.approver} on {self.run_id}:{self.call_id}"


class Slot(models.Model):
    """A slot of a concurrency limit (``engine.limits``) held by a run, or by one call of it,
    under the run's lease ``token``. Counted only while that lease is live, so a dead
    driver's slot frees with its lease; the next claim of the key deletes it."""

    key = models.CharField(max_length=300)
    holder = models.CharField(max_length=RUN_ID_LENGTH + 100)
    run_id = models.CharField(max_length=RUN_ID_LENGTH)
    token = models.CharField(max_length=64)
    taken_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["key", "holder"], name="da_slot_key_holder")]

    def __str__(self) -> str:
        return f"{self.key} held by {self.holder}"


class RateBucket(models.Model):
    """A rate limit's bucket (GCRA): when the next permit is due if calls keep coming at
    the rate (``tat``, the theoretical arrival time), by the database clock."""

    key = models.CharField(primary_key=True, max_length=300)
    tat = models.DateTimeField()

    def __str__(self) -> str:
        return self.key


class Throttle(models.Model):
    """Why a throttled run waits and when it tries again (``engine.limits``); one row per run,
    replaced each time it is throttled. Read only beside a run whose status is
    ``throttled``: a row left from an earlier wait means nothing."""

    run_id = models.CharField(primary_key=True, max_length=RUN_ID_LENGTH)
    agent = models.CharField(max_length=200, blank=True, default="")
    key = models.CharField(max_length=300)
    reason = models.CharField(max_length=16)
    limit = models.CharField(max_length=64, blank=True, default="")
    retry_at = models.DateTimeField()
    since = models.DateTimeField()
    tries = models.PositiveIntegerField(default=1)

    class Meta:
        verbose_name = "throttled run"
        indexes = [
            models.Index(fields=["key", "since"], name="da_throttle_key"),
            models.Index(fields=["retry_at"], name="da_throttle_retry"),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} waits for {self.key}"
