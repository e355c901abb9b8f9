"""Rows. The journal (``JournalEntry``) is the truth; ``Run`` is a projection the engine
keeps in step with it. Rows convert to frozen domain objects (``Run.to_domain()``) so the
engine never sees a model instance.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from .engine import ports

RUN_ID_LENGTH = 400


class Run(models.Model):
    STATUS_CHOICES = [(s, s.replace("_", " ")) for s in ports.STATUSES]

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
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)

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
        ]
        permissions = [
            ("approve_toolcall", "Can approve or deny tool calls"),
            ("resolve_halt", "Can resolve halted tool calls"),
            ("fork_run", "Can fork runs"),
            ("cancel_run", "Can cancel and resume runs"),
        ]

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
            created_at=self.created_at,
            updated_at=self.updated_at,
            finished_at=self.finished_at,
        )


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

    class Meta:
        ordering = ["seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "name"], name="da_journal_run_name"),
        ]
        indexes = [models.Index(fields=["run", "seq"], name="da_journal_run_seq")]
        verbose_name_plural = "journal entries"

    def __str__(self) -> str:
        return f"{self.run_id}:{self.name}"


class Lease(models.Model):
    """Who drives a run, until when (by the database clock). The token fences every write."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, primary_key=True)
    holder = models.CharField(max_length=200)
    token = models.CharField(max_length=64)
    expires_at = models.DateTimeField()
    renewed_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.run_id} held by {self.holder}"


class Halt(models.Model):
    """A run stopped on an operation whose outcome is unknown (a crash mid-effect, or a
    contended claim). Staff record what really happened; the run then continues."""

    CAUSES = [("crashed", "crashed"), ("contended", "contended")]
    STATUSES = [(ports.HALT_OPEN, "open"), (ports.HALT_RESOLVED, "resolved")]

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="halts")
    op_id = models.CharField(max_length=500, help_text="tool call id or step name")
    tool_name = models.CharField(max_length=200, blank=True, default="")
    arguments = models.JSONField(null=True, blank=True)
    attempt = models.CharField(max_length=600, blank=True, default="")
    attempted_at = models.DateTimeField(null=True, blank=True)
    cause = models.CharField(max_length=16, choices=CAUSES, default="crashed")
    status = models.CharField(max_length=16, choices=STATUSES, default=ports.HALT_OPEN)
    resolution = models.JSONField(null=True, blank=True)
    resolved_by = models.CharField(max_length=200, null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["run", "op_id"], name="da_halt_run_op"),
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
            status=self.status,
            resolution=self.resolution,
            resolved_by=self.resolved_by,
            created_at=self.created_at,
            resolved_at=self.resolved_at,
        )
