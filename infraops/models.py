"""Core domain: targets, goals (versioned), boundaries, criteria, experiments, samples, audit."""

from __future__ import annotations

import fnmatch
import functools
import re
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from infraops.manifest import Manifest, ManifestError, Probe, parse_manifest
from infraops.roles import ROLES


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def repo_label(url: str) -> str:
    """A repository URL as a page may show it: a local repository by its folder's name (in
    the data folder, by its place there), a remote URL without a password. A server's absolute
    paths told every reader the host's layout and said nothing a newcomer could use; the admin
    editor still shows the URL as it was registered."""
    local = url.removeprefix("file://") if url.startswith(("/", "file://")) else None
    if local is None:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.netloc.rsplit("@", 1)[1]
        user = f"{parts.username}@" if parts.username else ""
        return urlunsplit(parts._replace(netloc=user + host))
    path = Path(local)
    data = Path(settings.DATA_DIR).resolve()
    if path.resolve().is_relative_to(data):
        return f"data folder: {path.resolve().relative_to(data)}"
    return f"server folder: {path.name}"


class Target(models.Model):
    """A git repository under optimisation. InfraOps works in its own bare clone of it."""

    class Fetch(models.TextChoices):
        """Where the repository stands: being fetched by a worker, ready, or failed."""

        FETCHING = "fetching", "being fetched"
        READY = "ready", "ready"
        FAILED = "failed", "fetch failed"

    name = models.SlugField(max_length=80, unique=True)
    repo_url = models.CharField(
        "repository", max_length=500, help_text="A git URL or a path on the workers' machines."
    )
    base_branch = models.CharField(max_length=200, default="main")
    push_on_merge = models.BooleanField(
        default=False, help_text="After a merge in InfraOps' clone, push the branch to the origin."
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # The manifest as read at manifest_commit on the last refresh.
    manifest_commit = models.CharField(max_length=40, blank=True)
    manifest_text = models.TextField(blank=True)
    manifest_sha256 = models.CharField(max_length=64, blank=True)
    manifest_errors = models.JSONField(default=list, blank=True)
    refreshed_at = models.DateTimeField(null=True, blank=True)
    # The repository's git work (checking the URL's branch, cloning, fetching) runs in a
    # worker task with a deadline, never in a form's request (issue 28): where it stands.
    fetch_status = models.CharField(max_length=10, choices=Fetch.choices, default=Fetch.READY)
    fetch_error = models.TextField(blank=True, help_text="Why the last fetch failed.")
    fetch_requested_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def clone_path(self) -> Path:
        return Path(settings.DATA_DIR) / "repos" / f"target-{self.pk}.git"

    @property
    def repo_label(self) -> str:
        """The repository as the pages name it (repo_label)."""
        return repo_label(self.repo_url)

    def manifest(self) -> Manifest | None:
        """The parsed manifest, or None when it is missing or invalid (see manifest_errors)."""
        if not self.manifest_text or self.manifest_errors:
            return None
        try:
            return _parsed_manifest(self.manifest_text)
        except ManifestError:
            return None


@functools.lru_cache(maxsize=128)
def _parsed_manifest(text: str) -> Manifest:
    """parse_manifest, once per process for each text: the dashboard and the goal pages read
    every target's manifest on every request (a millisecond of TOML each). A Manifest is a
    frozen dataclass: its readers share it and change nothing of it."""
    return parse_manifest(text)


class TargetMembership(models.Model):
    """Who may see a target, and in which role (infraops.access reads it). A non-superuser
    sees only the targets they are a member of, with this role there; admins edit these rows
    on the target's admin page."""

    target = models.ForeignKey(Target, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="target_memberships")
    role = models.CharField(max_length=20, choices=[(role, role) for role in ROLES])
    created_at = models.DateTimeField(auto_now_add=True)
    # Who granted this role, and when: set again whenever the role changes (infraops.grants).
    # A reviewer's rights granted by a run's starter never decide that starter's changes.
    # Empty granted_by with a granted_at: the operator, from the command line; empty
    # granted_at: a row written before grants were recorded.
    granted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    granted_by_label = models.CharField("granted by", max_length=200, blank=True)
    granted_at = models.DateTimeField("granted at", null=True, blank=True)

    class Meta:
        ordering = ["target__name", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["target", "user"], name="membership_unique_per_target")
        ]

    def __str__(self) -> str:
        return f"{self.user} on {self.target}: {self.role}"


class SuperuserGrant(models.Model):
    """Who made a user a superuser, and when (infraops.grants). A superuser holds the reviewer
    role on every target, so this grant is the provenance of those rights; the latest row of
    a user who is a superuser now is the grant in force."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="superuser_grants")
    granted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    granted_by_label = models.CharField(max_length=200)
    granted_at = models.DateTimeField()

    class Meta:
        ordering = ["-granted_at", "-id"]
        indexes = [models.Index(fields=["user", "-granted_at"], name="superuser_grant_user")]

    def __str__(self) -> str:
        return f"{self.user} made a superuser by {self.granted_by_label}"


MAX_COOLDOWN_HOURS = 24 * 365


class GrantPolicy(models.Model):
    """How long granted rights wait before they decide a change: the cool-down of separation
    of duties (infraops.grants), set by an admin. One row (pk 1), or none: the environment's
    default (INFRAOPS_REVIEW_GRANT_COOLDOWN_HOURS) holds until an admin sets a value.

    A lowered cool-down binds only once the one it replaced has run its course since the
    change (`held_hours` until `held_until`): an admin who set it to 0 and at once made an
    account a reviewer would otherwise have that account decide at once."""

    SINGLETON = 1

    cooldown_hours = models.FloatField(
        "cool-down (hours)", null=True, blank=True,
        validators=[MinValueValidator(0), MaxValueValidator(MAX_COOLDOWN_HOURS)],
        help_text="Reviewer rights a person granted less than this many hours ago decide no "
                  "change yet (0: off). Blank: the server's default "
                  "(INFRAOPS_REVIEW_GRANT_COOLDOWN_HOURS).")
    held_hours = models.FloatField(default=0)
    held_until = models.DateTimeField(null=True, blank=True)
    changed_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    changed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = verbose_name_plural = "separation of duties"
        constraints = [models.CheckConstraint(condition=models.Q(pk=1),
                                              name="grant_policy_one_row")]

    def __str__(self) -> str:
        return "Separation of duties"

    @classmethod
    def load(cls) -> GrantPolicy:
        """The row, or an unsaved one with the defaults when no admin set anything yet."""
        return cls.objects.filter(pk=cls.SINGLETON).first() or cls(pk=cls.SINGLETON)

    @property
    def cooldown_set(self) -> float:
        """The cool-down as set: the admin's value, else the environment's default."""
        if self.cooldown_hours is None:
            return float(settings.REVIEW_GRANT_COOLDOWN_HOURS)
        return self.cooldown_hours

    def cooldown_at(self, when: datetime) -> float:
        """The cool-down in force at `when`, in hours: the one set, or the one a lowering
        replaced while that one still runs."""
        held = self.held_hours if self.held_until is not None and when < self.held_until else 0
        return max(self.cooldown_set, held)

    def decides_from(self, granted_at: datetime) -> datetime:
        """When rights granted at `granted_at` decide their first change: once the cool-down
        set has passed, and the one held has passed or stopped holding."""
        ready = granted_at + timedelta(hours=self.cooldown_set)
        if self.held_until is not None:
            held = min(granted_at + timedelta(hours=self.held_hours), self.held_until)
            ready = max(ready, held)
        return ready

    def cooldown_replace(self, hours: float | None, now: datetime) -> None:
        """Set the cool-down (None: the default again). The one it replaces still holds for
        as long as it lasts from now, and so does a hold already running: kept as one hold,
        the longer hours until the later end, never shorter than each."""
        holds = [(self.cooldown_set, now + timedelta(hours=self.cooldown_set))]
        if self.held_until is not None and now < self.held_until:
            holds.append((self.held_hours, self.held_until))
        self.cooldown_hours = hours
        held = max(hours_held for hours_held, _ in holds)
        if held > self.cooldown_set:
            self.held_hours, self.held_until = held, max(until for _, until in holds)
        else:
            self.held_hours, self.held_until = 0, None


class Goal(models.Model):
    """What to improve. The editable head; every saved edit becomes a GoalVersion."""

    class Direction(models.TextChoices):
        MINIMIZE = "minimize", "lower is better"
        MAXIMIZE = "maximize", "higher is better"

    class Policy(models.TextChoices):
        TUNER = "tuner", "built-in tuner (no LLM)"
        LLM = "llm", "LLM agent"

    target = models.ForeignKey(Target, on_delete=models.CASCADE, related_name="goals")
    name = models.CharField(max_length=200)
    probe = models.CharField(
        max_length=100, help_text="The manifest probe that reports the metric."
    )
    metric = models.CharField(max_length=100)
    direction = models.CharField(max_length=10, choices=Direction.choices, default="minimize")
    relative_target = models.FloatField(
        null=True,
        blank=True,
        help_text="Wanted improvement over the baseline as a fraction (0.10 = 10% better).",
    )
    absolute_target = models.FloatField(
        null=True, blank=True, help_text="Wanted value of the metric, in its own unit."
    )
    min_effect = models.FloatField(
        "smallest meaningful effect", null=True, blank=True,
        validators=[MinValueValidator(0.0001), MaxValueValidator(0.5)],
        help_text="A relative change of the goal's metric smaller than this (0.01 = 1%) is "
                  "'no change': the equivalence margin of its comparisons (other metrics keep "
                  "1%). Blank: 1%.",
    )
    policy = models.CharField(max_length=10, choices=Policy.choices, default="tuner")
    model_name = models.CharField(
        max_length=200, blank=True, help_text="LLM model for this goal; blank uses INFRAOPS_MODEL."
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    auto_merge = models.BooleanField(
        "merge automatically", default=False,
        help_text="Let a change merge with no person when every check of the merge gate passes "
                  "(no risk class, criteria passed on its head, clean feedback, confirmed end to "
                  "end, base unmoved). Off: every change waits for a reviewer.",
    )
    current_version = models.PositiveIntegerField(default=0, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["target__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["target", "name"], name="goal_unique_name_per_target")
        ]

    def __str__(self) -> str:
        return f"{self.target.name}: {self.name}"

    @property
    def relative_target_percent(self) -> str:
        return f"{self.relative_target:.0%}" if self.relative_target is not None else ""

    def meaning(self) -> str:
        """The goal in one sentence: 'lower latency-bench.latency_ms by at least 10% against
        the base, with 95% confidence, within 8 experiments'."""
        verb = "lower" if self.direction == self.Direction.MINIMIZE else "raise"
        said = f"{verb} {self.probe}.{self.metric}"
        if self.relative_target:
            said += f" by at least {self.relative_target:.0%} against the base"
        if self.absolute_target is not None:
            said += f"{',' if self.relative_target else ''} to {self.absolute_target:g} or better"
        said += ", with 95% confidence"
        boundary = getattr(self, "boundary", None) if self.pk else None
        if boundary is not None:
            said += f", within {boundary.max_experiments} experiments"
        return said

    def better(self, candidate: float, baseline: float) -> bool:
        if self.direction == self.Direction.MINIMIZE:
            return candidate < baseline
        return candidate > baseline


def _at_least(minimum: int | Decimal, message: str) -> MinValueValidator:
    return MinValueValidator(minimum, message=message)


class Boundary(models.Model):
    """What the agent may touch and spend. Enforced by code (reviews.diff_policy), not prompt."""

    goal = models.OneToOneField(Goal, on_delete=models.CASCADE, related_name="boundary")
    editable_paths = models.TextField(
        default="**", help_text="Path globs the agent may edit, one per line (** = any depth)."
    )
    protected_paths = models.TextField(
        blank=True,
        help_text="Globs never edited, one per line. infraops.toml and probe files always are.",
    )
    forbidden_patterns = models.TextField(
        blank=True, help_text="Regular expressions no added line may match, one per line."
    )
    # A budget of 0 would stop every run at its first check: each is at least 1 (1 cent).
    max_diff_lines = models.PositiveIntegerField(
        default=400, validators=[_at_least(1, "A diff budget is at least 1 changed line.")])
    max_steps = models.PositiveIntegerField(
        default=50, validators=[_at_least(1, "A step budget is at least 1 step.")])
    max_wall_minutes = models.PositiveIntegerField(
        default=120, validators=[_at_least(1, "A wall-time budget is at least 1 minute.")])
    max_tokens = models.PositiveIntegerField(
        default=2_000_000, validators=[_at_least(1, "A token budget is at least 1 token.")])
    max_cost_usd = models.DecimalField(
        max_digits=10, decimal_places=2, default=20,
        validators=[_at_least(Decimal("0.01"), "A cost budget is at least $0.01; a negative "
                                               "or zero budget is not a budget.")])
    max_experiments = models.PositiveIntegerField(
        default=20, validators=[_at_least(1, "An experiment budget is at least 1 experiment.")])

    def __str__(self) -> str:
        return f"boundary of {self.goal}"

    def clean(self) -> None:
        errors: dict[str, list[str]] = {}
        for field in ("editable_paths", "protected_paths"):
            for glob in _lines(getattr(self, field)):
                problem = glob_problem(glob)
                if problem:
                    errors.setdefault(field, []).append(f"{glob!r}: {problem}")
        for pattern in _lines(self.forbidden_patterns):
            try:
                re.compile(pattern)
            except re.error as exc:
                errors.setdefault("forbidden_patterns", []).append(
                    f"{pattern!r} is not a valid regular expression: {exc}"
                )
        if errors:
            raise ValidationError(errors)

    def as_spec(self) -> dict[str, Any]:
        return {
            "editable_paths": _lines(self.editable_paths),
            "protected_paths": _lines(self.protected_paths),
            "forbidden_patterns": _lines(self.forbidden_patterns),
            "max_diff_lines": self.max_diff_lines,
            "max_steps": self.max_steps,
            "max_wall_minutes": self.max_wall_minutes,
            "max_tokens": self.max_tokens,
            "max_cost_usd": str(self.max_cost_usd),
            "max_experiments": self.max_experiments,
        }


def glob_problem(glob: str) -> str | None:
    """Why a path glob is unusable, or None. Globs are repository-relative."""
    if glob.startswith("/"):
        return "must be relative to the repository root (no leading /)"
    if ".." in Path(glob).parts:
        return "must not contain '..'"
    if glob.count("[") != glob.count("]"):
        return "has an unbalanced [ ]"
    try:
        re.compile(fnmatch.translate(glob))
    except re.error as exc:
        return f"is not a valid glob ({exc})"
    return None


class AcceptanceCriterion(models.Model):
    """A typed condition a change must meet. Quantity by kind:

    threshold: candidate value;  relative: candidate / baseline - 1;
    relation: value at `variant` / value at `reference_variant` - 1 (both on the candidate).
    The quantity is compared with `value` by `comparison`. Unmeasured means failed.
    """

    class Kind(models.TextChoices):
        THRESHOLD = "threshold", "threshold on the candidate"
        RELATIVE = "relative", "relative to the baseline"
        RELATION = "relation", "relation between two scenarios"

    class Comparison(models.TextChoices):
        AT_MOST = "<=", "at most"
        AT_LEAST = ">=", "at least"

    goal = models.ForeignKey(Goal, on_delete=models.CASCADE, related_name="criteria")
    name = models.CharField(
        max_length=120, blank=True,
        help_text="How verdicts call it, e.g. 'prefill+kv within 5% of prefill'. Blank: the "
                  "condition itself.")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    probe = models.CharField(max_length=100)
    metric = models.CharField(max_length=100)
    variant = models.CharField(
        max_length=200, blank=True, help_text="Variant as key=value[,key=value]; blank: all."
    )
    reference_variant = models.CharField(
        max_length=200, blank=True, help_text="For a relation: the scenario compared against."
    )
    comparison = models.CharField(max_length=2, choices=Comparison.choices, default="<=")
    value = models.FloatField()

    class Meta:
        verbose_name_plural = "acceptance criteria"

    def __str__(self) -> str:
        return self.name or self.describe()

    def describe(self) -> str:
        where = f"{self.probe}.{self.metric}" + (f" [{self.variant}]" if self.variant else "")
        if self.kind == self.Kind.THRESHOLD:
            return f"{where} {self.comparison} {self.value:g}"
        if self.kind == self.Kind.RELATIVE:
            return f"{where} vs baseline {self.comparison} {self.value:+.1%}"
        return f"{where} vs [{self.reference_variant}] {self.comparison} {self.value:+.1%}"

    def clean(self) -> None:
        errors: dict[str, str] = {}
        for field in ("variant", "reference_variant"):
            try:
                parse_variant(getattr(self, field))
            except ValueError as exc:
                errors[field] = str(exc)
        if self.kind == self.Kind.RELATION and not self.reference_variant:
            errors["reference_variant"] = "A relation compares two scenarios: name the reference."
        if errors:
            raise ValidationError(errors)

    def as_spec(self) -> dict[str, Any]:
        return {
            "id": self.pk,
            "kind": self.kind,
            "probe": self.probe,
            "metric": self.metric,
            "variant": self.variant,
            "reference_variant": self.reference_variant,
            "comparison": self.comparison,
            "value": self.value,
            "name": self.name or self.describe(),
            "description": self.describe(),
        }


def parse_variant(text: str) -> dict[str, str]:
    """'cp=on,precision=tf32' -> {'cp': 'on', 'precision': 'tf32'}; '' -> {}."""
    result: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"{part!r} is not key=value")
        result[key.strip()] = value.strip()
    return result


def variant_key(variant: dict[str, str]) -> str:
    """The canonical text of a variant: keys sorted, 'a=1,b=2'; '' for the default."""
    return ",".join(f"{k}={variant[k]}" for k in sorted(variant))


class GoalVersion(models.Model):
    """An immutable snapshot of a goal with its boundary and criteria. Runs pin one."""

    goal = models.ForeignKey(Goal, on_delete=models.PROTECT, related_name="versions")
    number = models.PositiveIntegerField()
    spec = models.JSONField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["goal", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["goal", "number"], name="goal_version_unique_number")
        ]

    def __str__(self) -> str:
        return f"{self.goal} v{self.number}"


class ExperimentQuerySet(models.QuerySet["Experiment"]):
    def open(self) -> ExperimentQuerySet:
        return self.filter(status__in=[Experiment.Status.QUEUED, Experiment.Status.RUNNING])


class Experiment(models.Model):
    """One execution of probes on a candidate and a baseline revision of a target."""

    class Status(models.TextChoices):
        # What ran, not what the results say: that is the feedback's verdict.
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded", "all probes ran"
        FAILED = "failed", "did not finish: a probe failed or could not run"
        CANCELLED = "cancelled"

    target = models.ForeignKey(Target, on_delete=models.PROTECT, related_name="experiments")
    status = models.CharField(max_length=10, choices=Status.choices, default="queued")
    candidate_commit = models.CharField(max_length=40)
    baseline_commit = models.CharField(max_length=40)
    probes = models.JSONField(default=list, help_text="Probe names chosen to run, cheapest first.")
    variants = models.JSONField(
        default=dict, blank=True,
        help_text="Variant cells chosen per probe, {probe: [cell, ...]} with cells as "
                  "variant_key spells them ('batch=8,dtype=fp16'); a probe not named runs "
                  "every cell.")
    changed_paths = models.JSONField(default=list, blank=True,
                                     help_text="Paths the candidate changes against the baseline.")
    stop_on_failure = models.BooleanField(
        default=True, help_text="A failing cheaper probe stops the costlier ones.")
    queue = models.CharField(max_length=100, default="experiments")
    enqueued_at = models.DateTimeField(null=True, blank=True)
    origin = models.CharField(max_length=200, blank=True, help_text="Who asked, in words.")
    manifest_sha256 = models.CharField(max_length=64, blank=True)
    probe_files = models.JSONField(default=dict, blank=True,
                                   help_text="Git blob ids of the probes' files at the baseline.")
    log_seq = models.PositiveIntegerField(default=0)
    # Lease: a worker owns the experiment until lease_expires_at; the reaper re-queues after.
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=3)
    claimed_by = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    failure_reason = models.TextField(blank=True)
    lost = models.BooleanField(
        default=False,
        help_text="Failed for the infrastructure's reasons, not the candidate's (attempts ran "
                  "out without a result, no sandbox, an unexpected error such as a database "
                  "that kept failing): no evidence either way, which a run must not choose on.")
    seed = models.BigIntegerField(
        null=True, blank=True,
        help_text="INFRAOPS_SEED of every sample (warm-ups and the second-seed check draw "
                  "another). The experiments of one agent run share it, so the configurations "
                  "it compares see the same inputs. Blank: drawn at random when it runs.")
    summary = models.JSONField(default=dict, blank=True)
    criteria = models.JSONField(default=list, blank=True,
                                help_text="Acceptance criteria (specs) this experiment checks.")
    margin = models.FloatField(
        default=0.01, help_text="Equivalence margin: a change whose interval lies within "
                                "+-margin is 'no change' (the goal's smallest meaningful effect).")
    margin_metric = models.CharField(
        max_length=201, blank=True,
        help_text="probe.metric the margin is the smallest meaningful effect of (the goal's); "
                  "other metrics use the default 1%. Blank: every metric.")
    feedback = models.JSONField(default=dict, blank=True,
                                help_text="Findings, most specific first "
                                          "(infraops.feedback.findings).")

    objects = ExperimentQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["status", "lease_expires_at"])]

    def __str__(self) -> str:
        return f"experiment {self.pk} on {self.target_id}"

    @property
    def is_finished(self) -> bool:
        return self.status in (self.Status.SUCCEEDED, self.Status.FAILED, self.Status.CANCELLED)

    def runs_cell(self, probe: str, cell: str) -> bool:
        """Whether this experiment runs the variant cell `cell` (canonical, see variant_key)
        of `probe`: every cell unless `variants` names the probe, then only those it lists."""
        chosen = (self.variants or {}).get(probe)
        return chosen is None or cell in chosen

    def variant_cells(self, probe: Probe) -> list[dict[str, str]]:
        """The cells of `probe` this experiment runs, in the order of its variant matrix."""
        return [cell for cell in probe.variant_matrix()
                if self.runs_cell(probe.name, variant_key(cell))]


class ProbeExecution(models.Model):
    """One sandboxed run of one probe, on one side, one variant, one repeat, one attempt."""

    class Side(models.TextChoices):
        BASELINE = "baseline"
        CANDIDATE = "candidate"

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="executions")
    attempt = models.PositiveIntegerField()
    probe = models.CharField(max_length=100)
    side = models.CharField(max_length=10, choices=Side.choices)
    variant = models.CharField(max_length=200, blank=True)
    # Negative for a warm-up (-1 the last before the samples): run, kept, never a sample.
    repeat_index = models.IntegerField()
    seed = models.BigIntegerField(null=True, blank=True,
                                  help_text="INFRAOPS_SEED of this execution.")
    exit_code = models.IntegerField(null=True)
    reason = models.CharField(max_length=40)
    detail = models.TextField(blank=True)
    wall_seconds = models.FloatField()
    stdout = models.TextField(blank=True)
    stderr = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["experiment", "attempt", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["experiment", "attempt", "probe", "side", "variant", "repeat_index"],
                name="probe_execution_unique_per_attempt",
            )
        ]

    def __str__(self) -> str:
        which = "warm-up" if self.is_warmup else f"#{self.repeat_index}"
        return f"{self.probe} {self.side} [{self.variant}] {which}"

    @property
    def is_warmup(self) -> bool:
        return self.repeat_index < 0


class Artifact(models.Model):
    """A file a probe wrote into INFRAOPS_OUT, kept in the content-addressed store."""

    execution = models.ForeignKey(ProbeExecution, on_delete=models.CASCADE,
                                  related_name="artifacts")
    name = models.CharField(max_length=300, help_text="Path inside INFRAOPS_OUT.")
    sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["execution", "name"],
                                               name="artifact_unique_name")]

    def __str__(self) -> str:
        return self.name


class ExperimentLog(models.Model):
    """A batch of a probe's output, in order; the experiment page streams these."""

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="logs")
    seq = models.PositiveIntegerField()
    execution_label = models.CharField(max_length=300)
    stream = models.CharField(max_length=10)
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["experiment", "seq"]
        constraints = [models.UniqueConstraint(fields=["experiment", "seq"],
                                               name="experiment_log_unique_seq")]

    def __str__(self) -> str:
        return f"experiment {self.experiment_id} log #{self.seq}"


class Sample(models.Model):
    """One measured value from a probe's metrics.jsonl."""

    execution = models.ForeignKey(ProbeExecution, on_delete=models.CASCADE, related_name="samples")
    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="samples")
    probe = models.CharField(max_length=100)
    side = models.CharField(max_length=10, choices=ProbeExecution.Side.choices)
    variant = models.CharField(max_length=200, blank=True)
    metric = models.CharField(max_length=100)
    value = models.FloatField()
    unit = models.CharField(max_length=40, blank=True)
    case = models.CharField(max_length=200, blank=True)
    labels = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [models.Index(fields=["experiment", "probe", "metric"])]

    def __str__(self) -> str:
        return f"{self.metric}={self.value}{self.unit}"


class AuditEntry(models.Model):
    """Append-only record of who did what. A database trigger refuses UPDATE and DELETE,
    so users who acted are deactivated, never deleted (PROTECT)."""

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    actor_label = models.CharField(max_length=200)
    action = models.CharField(max_length=100)
    object_type = models.CharField(max_length=100)
    object_id = models.CharField(max_length=100)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.actor_label} {self.action} {self.object_type}:{self.object_id}"



class Worker(models.Model):
    """A Celery worker on another host, known to the web by its token (infraops/experiments/
    fleet.py). The token is shown once at registration and stored only as its sha256: it is
    32 random bytes, so a fast hash is enough and a leaked table reveals no usable token.
    The fields below `revoked_by` are what the worker last reported in its heartbeat."""

    name = models.SlugField(max_length=80, unique=True)
    queues = models.JSONField(default=list, help_text="Celery queues it consumes, such as "
                              '["experiments", "experiments.gpu"].')
    token_prefix = models.CharField(max_length=12, db_index=True)
    token_hash = models.CharField(max_length=64)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    host = models.CharField(max_length=255, blank=True)
    version = models.CharField(max_length=40, blank=True)
    accelerators = models.JSONField(default=list, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    running = models.CharField(max_length=200, blank=True,
                               help_text='What it runs now, such as "experiment 12"; "" when idle.')
    last_seen_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None
