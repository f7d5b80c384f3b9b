"""factory_boy factories for the rows tests build: users, targets, goals (with their boundary,
criteria and pinned version), agent runs, experiments and changes.

Defaults are the plain shapes most tests wrote by hand; a test that depends on a value passes
it explicitly. Rows that need real git (a registered target with a clone and a manifest) come
from the fixtures in tests/conftest.py (`example_target`, `example_goal`), not from here.

    GoalFactory(target=t, owner=u, boundary__editable_paths="config/**", criteria=[{...}],
                snapshot_by=u)                    # goal, boundary, criteria, then version 1
    AgentRunFactory(goal=goal, started_by=u)      # pins the goal's latest version
    ExperimentFactory(target=t, status="succeeded")
    ChangeFactory(goal=goal, title="...")         # on the goal's target
"""

from __future__ import annotations

from typing import Any, cast

import factory
from django.contrib.auth.models import Group, User

from agents.models import AgentRun
from infraops.models import (
    AcceptanceCriterion,
    Boundary,
    Experiment,
    Goal,
    GoalVersion,
    Target,
    TargetMembership,
)
from infraops.services.goals import goal_snapshot
from infraops.services.targets import first_role
from reviews.models import Change

PASSWORD = "correct horse battery"

# The criterion of the example goal (tests/conftest.py): latency 5% better than the baseline.
LATENCY_CRITERION = {"kind": "relative", "probe": "latency-bench", "metric": "latency_ms",
                     "comparison": "<=", "value": -0.05}


class UserFactory(factory.django.DjangoModelFactory[User]):
    class Meta:
        model = User
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.PostGenerationMethodCall("set_password", PASSWORD)

    @factory.post_generation
    def roles(self, create: bool, extracted: Any, **kwargs: Any) -> None:
        for role in extracted or ():
            # get_or_create: a transactional test's flush removes the migration's groups.
            self.groups.add(Group.objects.get_or_create(name=role)[0])
        self.is_staff = "engineer" in (extracted or ())
        self.save()

    @factory.post_generation
    def member_of(self, create: bool, extracted: Any, **kwargs: Any) -> None:
        """The targets the user is a member of, in their first role: by default every target
        that exists (so tests about roles keep the one-team world they were written in);
        `member_of=[]` for none, or a list of targets."""
        role = first_role(cast(User, self))
        targets = Target.objects.all() if extracted is None else extracted
        if role is not None:
            for target in targets:
                TargetMembership.objects.get_or_create(target=target, user=self,
                                                       defaults={"role": role})


class TargetFactory(factory.django.DjangoModelFactory[Target]):
    """A target row with no clone and no manifest (its repository is nowhere): enough for
    pages, access checks and rows that point at a target. For a real clone use
    target_register (the `example_target` fixture)."""

    class Meta:
        model = Target

    name = factory.Sequence(lambda n: f"target-{n}")
    repo_url = factory.LazyAttribute(lambda o: f"/nowhere-{o.name}.git")


class BoundaryFactory(factory.django.DjangoModelFactory[Boundary]):
    """The model's defaults (editable "**", the default budgets) unless told."""

    class Meta:
        model = Boundary

    goal = factory.SubFactory("tests.factories.GoalFactory")


class AcceptanceCriterionFactory(factory.django.DjangoModelFactory[AcceptanceCriterion]):
    """The goal's own metric 5% better than the baseline (relative, <= -0.05)."""

    class Meta:
        model = AcceptanceCriterion

    goal = factory.SubFactory("tests.factories.GoalFactory")
    kind = AcceptanceCriterion.Kind.RELATIVE
    probe = factory.SelfAttribute("goal.probe")
    metric = factory.SelfAttribute("goal.metric")
    comparison = "<="
    value = -0.05


class GoalFactory(factory.django.DjangoModelFactory[Goal]):
    """A goal on latency-bench.latency_ms (the model's defaults: minimize, tuner policy).

    Extras, made in this order after the goal:
    `boundary=True`, `boundary={field: value}` or `boundary__<field>=...`: its Boundary;
    `criteria=[{field: value}, ...]`: AcceptanceCriterion rows (AcceptanceCriterionFactory);
    `snapshot_by=user` (or True for no user): goal_snapshot takes its version, as saving the
    goal in the app does; a run pins that version."""

    class Meta:
        model = Goal
        skip_postgeneration_save = True

    target = factory.SubFactory(TargetFactory)
    name = factory.Sequence(lambda n: f"goal {n}")
    probe = "latency-bench"
    metric = "latency_ms"

    @factory.post_generation
    def boundary(self, create: bool, extracted: Any, **kwargs: Any) -> None:
        if extracted or kwargs:
            fields = extracted if isinstance(extracted, dict) else {}
            BoundaryFactory.create(goal=self, **fields, **kwargs)

    @factory.post_generation
    def criteria(self, create: bool, extracted: Any, **kwargs: Any) -> None:
        for fields in extracted or ():
            AcceptanceCriterionFactory.create(goal=self, **fields)

    @factory.post_generation
    def snapshot_by(self, create: bool, extracted: Any, **kwargs: Any) -> None:
        if extracted:
            goal_snapshot(goal=cast(Goal, self),
                          user=extracted if isinstance(extracted, User) else None)


class GoalVersionFactory(factory.django.DjangoModelFactory[GoalVersion]):
    """A goal's version as the app takes it (goal_snapshot), of a new goal with a boundary
    unless told."""

    class Meta:
        model = GoalVersion

    goal = factory.SubFactory(GoalFactory, boundary=True)
    created_by = None

    @classmethod
    def _create(cls, model_class: Any, *args: Any, **kwargs: Any) -> GoalVersion:
        return goal_snapshot(goal=kwargs["goal"], user=kwargs.get("created_by"))


class ExperimentFactory(factory.django.DjangoModelFactory[Experiment]):
    """A queued experiment, candidate "b"*40 against baseline "a"*40 (a Change's default
    head and base)."""

    class Meta:
        model = Experiment

    target = factory.SubFactory(TargetFactory)
    candidate_commit = "b" * 40
    baseline_commit = "a" * 40


class AgentRunFactory(factory.django.DjangoModelFactory[AgentRun]):
    """A running run. `goal=g` pins g's latest version (snapshot it first); without it, a new
    goal's version. Target and policy are its goal's; base commit and manifest hash the
    target's as last refreshed (base "a"*40 for a target never refreshed)."""

    class Meta:
        model = AgentRun

    class Params:
        goal = None

    goal_version = factory.Maybe(
        "goal",
        yes_declaration=factory.LazyAttribute(lambda o: o.goal.versions.latest("number")),
        no_declaration=factory.SubFactory(GoalVersionFactory),
    )
    target = factory.SelfAttribute("goal_version.goal.target")
    policy = factory.SelfAttribute("goal_version.goal.policy")
    started_by = factory.SubFactory(UserFactory)
    base_commit = factory.LazyAttribute(lambda o: o.target.manifest_commit or "a" * 40)
    manifest_sha256 = factory.SelfAttribute("target.manifest_sha256")


class ChangeFactory(factory.django.DjangoModelFactory[Change]):
    """A change awaiting review: base "a"*40, head "b"*40, a one-hunk diff with its true
    hash. On its goal's target when it has a goal."""

    class Meta:
        model = Change

    goal = None
    target = factory.Maybe("goal", yes_declaration=factory.SelfAttribute("goal.target"),
                           no_declaration=factory.SubFactory(TargetFactory))
    title = factory.Sequence(lambda n: f"change {n}")
    hypothesis = "h"
    base_commit = "a" * 40
    head_commit = "b" * 40
    diff = "--- a\n+++ b\n"
    diff_sha256 = factory.LazyAttribute(lambda o: Change.hash_diff(o.diff))
    author_label = "run 1"
