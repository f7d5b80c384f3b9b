"""A change that sets a knob whose manifest entry names a skeleton records a use of it,
whoever made the change (skeletons.outcomes.skeleton_uses_from_knobs). The built-in tuner never
calls skeleton_apply: the showcase's three merged changes left the three seeded skeletons
"not applied yet"."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from agents.models import AgentRun
from infraops.manifest import ManifestError, parse_manifest
from infraops.models import Goal, Target
from reviews.models import Change
from reviews.signals import change_submitted
from skeletons.models import Skeleton, SkeletonUse
from skeletons.outcomes import added_lines, skeleton_outcome_record
from tests.factories import AgentRunFactory, ChangeFactory
from tests.infraops.test_manifest import KNOB, PROBE

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("skeleton_seeds")]

NUMERICS = "Numerics: the context-parallel merge stays close to the sequential path"
PRECISION = ('--- a/kda/merge.py\n+++ b/kda/merge.py\n@@ -10 +10 @@\n'
             '-INPUT_PRECISION = "tf32"\n+INPUT_PRECISION = "ieee"\n')


@pytest.fixture
def demo(engineer: User) -> Target:
    """examples/demo-kernels, whose three knobs name the three seeded skeletons."""
    call_command("load_example", "demo-kernels", stdout=StringIO())
    return Target.objects.get(name="demo-kernels")


def submitted(demo: Target, engineer: User, diff: str) -> tuple[AgentRun, Change]:
    goal = Goal.objects.get(target=demo, name=NUMERICS)
    run = AgentRunFactory.create(goal=goal, started_by=engineer)
    change = ChangeFactory.create(target=demo, goal=goal, diff=diff, title="Tune ieee")
    run.changes.add(change)
    change_submitted.send(sender=None, change_id=change.pk)
    return run, change


def test_the_tuners_precision_change_applies_the_higher_precision_skeleton(
        demo: Target, engineer: User, client: Client) -> None:
    run, change = submitted(demo, engineer, PRECISION)

    use = SkeletonUse.objects.get()
    assert (use.skeleton.slug, use.run_id, use.change_id, use.outcome) == (
        "higher-precision-merge", run.pk, change.pk, SkeletonUse.Outcome.APPLIED)
    assert "sets the knob input_precision in kda/merge.py" in use.note
    client.force_login(engineer)
    page = client.get("/skeletons/higher-precision-merge/").content.decode()
    assert "Not applied yet" not in page
    assert "Applied 1 time: 0 accepted, 0 rejected, 1 open" in page


def test_its_merge_is_the_uses_outcome(demo: Target, engineer: User) -> None:
    _, change = submitted(demo, engineer, PRECISION)
    Change.objects.filter(pk=change.pk).update(status=Change.Status.MERGED)

    skeleton_outcome_record(change_id=change.pk)

    usage = Skeleton.objects.get(slug="higher-precision-merge").usage()
    assert (usage.applied, usage.accepted) == (1, 1)


def test_a_change_that_sets_no_tied_knob_applies_nothing_and_twice_is_once(
        demo: Target, engineer: User) -> None:
    other = ('--- a/kda/README.md\n+++ b/kda/README.md\n@@ -1 +1 @@\n'
             '-INPUT_PRECISION = "tf32"\n+INPUT_PRECISION = "ieee"\n')
    submitted(demo, engineer, other)
    assert not SkeletonUse.objects.exists()

    _, change = submitted(demo, engineer, PRECISION)
    change_submitted.send(sender=None, change_id=change.pk)
    assert SkeletonUse.objects.count() == 1


def test_added_lines_are_read_by_file_and_a_removed_line_like_a_header_is_no_header() -> None:
    diff = ('--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n--- not a header\n+++ added\n'
            '--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+NEW = 1\n')

    assert added_lines(diff) == {"x.py": ["++ added"], "new.py": ["NEW = 1"]}


def manifest_with_knob(extra: str) -> str:
    """A probe and one knob (tests/infraops/test_manifest.py's PROBE and KNOB), plus `extra`."""
    return PROBE + KNOB + extra


def test_a_knob_names_its_skeleton_by_slug(settings: Any) -> None:
    knob = parse_manifest(manifest_with_knob('skeleton = "fuse-per-tile-work"\n')).knobs[0]
    assert knob.skeleton == "fuse-per-tile-work"
    with pytest.raises(ManifestError, match="skeleton 'Fuse per tile' is not a skeleton's slug"):
        parse_manifest(manifest_with_knob('skeleton = "Fuse per tile"\n'))
