"""An agent run: one supervised attempt at a pinned goal version."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils.functional import cached_property

from infraops.models import Experiment, GoalVersion, Target
from infraops.reads import JoinedRead
from reviews.models import Change


class AgentRunQuerySet(models.QuerySet["AgentRun"]):
    def active(self) -> AgentRunQuerySet:
        return self.filter(status__in=[AgentRun.Status.RUNNING, AgentRun.Status.PAUSED])


class AgentRun(models.Model):
    class Status(models.TextChoices):
        RUNNING = "running"
        PAUSED = "paused"
        SUCCEEDED = "succeeded"
        FINISHED = "finished"  # ended as planned with nothing to submit (nothing beat the base)
        FAILED = "failed"  # what no retry can fix
        CANCELLED = "cancelled"

    goal_version = models.ForeignKey(GoalVersion, on_delete=models.PROTECT, related_name="runs")
    target = models.ForeignKey(Target, on_delete=models.PROTECT, related_name="runs")
    policy = models.CharField(max_length=10)
    status = models.CharField(max_length=10, choices=Status.choices, default="running")
    started_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                                   related_name="+")
    base_commit = models.CharField(max_length=40)
    manifest_sha256 = models.CharField(max_length=64)
    step_count = models.PositiveIntegerField(default=0)
    experiment_count = models.PositiveIntegerField(default=0)
    tokens_used = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=10, decimal_places=4, default=0)
    event_seq = models.PositiveIntegerField(default=0)
    state = models.JSONField(default=dict, blank=True, help_text="The policy's own state.")
    stop_reason = models.TextField(blank=True)
    malformed_in_row = models.PositiveIntegerField(default=0)
    waiting_for = models.ForeignKey(
        Experiment, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="The experiment the run waits for; its end wakes the run.")
    provider_failing_since = models.DateTimeField(
        null=True, blank=True,
        help_text="When the model endpoint began failing (5xx, timeouts, refused connections, "
                  "429s): the retry window's start; cleared by the next answer.")
    progress_floor = models.PositiveIntegerField(
        default=0, help_text="The 'no progress' check reads only experiments after this id "
                             "(set on Resume: a fresh allowance).")
    branch = models.CharField(max_length=200, blank=True)
    follows_change = models.ForeignKey(
        Change, null=True, blank=True, on_delete=models.PROTECT, related_name="follow_ups",
        help_text="A follow-up run: a reviewer requested changes on this change after its run "
                  "ended, and the comments were the run's first message.")
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    experiments = models.ManyToManyField(Experiment, blank=True, related_name="runs")
    changes = models.ManyToManyField(Change, blank=True, related_name="runs")

    objects = AgentRunQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"run {self.pk}"

    @classmethod
    def active_statuses(cls) -> tuple[str, ...]:
        """A run still going (or waiting to be resumed): a second one on its goal competes."""
        return (cls.Status.RUNNING, cls.Status.PAUSED)

    @property
    def is_finished(self) -> bool:
        return self.status in (self.Status.SUCCEEDED, self.Status.FINISHED, self.Status.FAILED,
                               self.Status.CANCELLED)

    @property
    def shown_status(self) -> str:
        """The status as the run lists show it: a run a person stopped reads "stopped" (the
        best so far submitted, or nothing), not "succeeded" as if it had reached its end."""
        stopped = (self.state or {}).get("stopped_by")
        if stopped and self.status in (self.Status.SUCCEEDED, self.Status.FINISHED):
            return "stopped"
        return str(self.status)

    @property
    def budget(self) -> dict[str, object]:
        spec: dict[str, object] = self.goal_version.spec["boundary"]
        return spec

    @cached_property
    def last_event(self) -> RunEvent | None:
        """The run's newest event (the page shows a wait for the model endpoint from it), read
        by a statement built once per process: the ORM's `run.events.last` was a sixth of the
        run page's web CPU (bench/load.py)."""
        return _LAST_EVENT.get(self.pk)


class Step(models.Model):
    """One agent step: what it decided, which tool it called, what came back."""

    run = models.ForeignKey(AgentRun, on_delete=models.CASCADE, related_name="steps")
    number = models.PositiveIntegerField()
    summary = models.TextField()
    tool = models.CharField(max_length=100, blank=True)
    arguments = models.JSONField(default=dict, blank=True)
    result = models.JSONField(default=dict, blank=True)
    calls = models.JSONField(
        default=list, blank=True,
        help_text="Each tool call of the step: name, arguments, ok, refusal, malformed, content.")
    verdict = models.CharField(max_length=300, blank=True,
                               help_text="What came of the step, in one line.")
    experiment = models.ForeignKey(Experiment, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+",
                                   help_text="The experiment the step requested or read.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "number"]
        constraints = [models.UniqueConstraint(fields=["run", "number"], name="step_unique_number")]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.number}"


class Hypothesis(models.Model):
    """An entry of the run's hypothesis ledger, by the agent or by a person."""

    class Status(models.TextChoices):
        OPEN = "open"
        CONFIRMED = "confirmed"
        REFUTED = "refuted"
        ABANDONED = "abandoned"

    run = models.ForeignKey(AgentRun, on_delete=models.CASCADE, related_name="hypotheses")
    title = models.CharField(max_length=200)
    rationale = models.TextField(blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default="open")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                               on_delete=models.PROTECT, related_name="+",
                               help_text="The person who added it; empty: the agent.")
    experiments = models.ManyToManyField(Experiment, blank=True, related_name="hypotheses")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["run", "created_at"]
        verbose_name_plural = "hypotheses"

    def __str__(self) -> str:
        return self.title

    @property
    def author_label(self) -> str:
        return self.author.get_username() if self.author else "agent"


class RunMessage(models.Model):
    """A person's message to the agent mid-run; the agent receives it at its next step."""

    run = models.ForeignKey(AgentRun, on_delete=models.CASCADE, related_name="messages")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                               related_name="+")
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at_step = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["run", "created_at"]

    def __str__(self) -> str:
        return f"message to run {self.run_id}"


class RunEvent(models.Model):
    """The durable live log of a run. The websocket only says 'new events up to seq'."""

    class Kind(models.TextChoices):
        STATUS = "status"
        STEP = "step"
        EXPERIMENT = "experiment"
        CHANGE = "change"
        REFUSAL = "refusal"
        ERROR = "error"
        WAIT = "wait"

    run = models.ForeignKey(AgentRun, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=20, choices=Kind.choices)
    message = models.TextField()
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="run_event_unique_seq")]

    def __str__(self) -> str:
        return f"run {self.run_id} #{self.seq} {self.kind}"


_LAST_EVENT = JoinedRead(RunEvent, where='t0."run_id" = %s', order_by='t0."seq" DESC', limit=1)
