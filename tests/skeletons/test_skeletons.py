"""The skeleton library: conditions as predicates (validated, evaluated, unknown when nothing
is known), the facts feedback measures, statistics from real uses, the seeded techniques, the
pages (search, detail, promotion, what each reader may see), the admin editor, and what a
merged or rejected change does to the library."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.signals import before_task_publish
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from hypothesis import given
from hypothesis import settings as examples
from hypothesis import strategies as st

from agents.models import AgentRun
from agents.policies.shared import submit_change
from infraops import gitops
from infraops.manifest import ManifestError, parse_manifest
from infraops.models import AuditEntry, Goal, GoalVersion, Target
from reviews.models import Change
from reviews.services import change_advance, review_decide
from reviews.tasks import change_advance as change_advance_task
from skeletons.applicability import (
    MET,
    NOT_MET,
    OPS,
    PRECISION,
    SERIALIZED,
    UNKNOWN,
    Predicate,
    PredicateError,
    evaluate,
    matches,
    measured_facts,
    predicate_problems,
    probe_metadata,
    validate_predicates,
    with_facts,
)
from skeletons.models import Skeleton, SkeletonEvidence, SkeletonUse, UsageStats
from skeletons.outcomes import skeleton_outcome_record, verified_gain
from skeletons.tasks import skeleton_outcome
from tests.conftest import member
from tests.factories import (
    LATENCY_CRITERION,
    AgentRunFactory,
    ChangeFactory,
    ExperimentFactory,
    GoalFactory,
    TargetFactory,
    UserFactory,
)
from tests.reviews.conftest import ENGINE_EDIT, criterion_finding

OUTCOME_QUEUE = "agent"  # where CELERY_TASK_ROUTES sends skeletons.tasks.*
SEEDED = ("higher-precision-merge", "release-gil-around-native-waits", "fuse-per-tile-work")


@pytest.fixture(autouse=True)
def seeded(request: pytest.FixtureRequest) -> None:
    """The seeds, for the tests that use the database (see tests/conftest.py)."""
    if request.node.get_closest_marker("django_db") or "db" in request.fixturenames:
        request.getfixturevalue("skeleton_seeds")


# --------------------------------------------------------------------------- predicates


@pytest.mark.parametrize(("raw", "expected"), [
    ({"field": "dtype"}, "must be a list of objects"),
    (["dtype"], "condition 1: must be an object with field, op, value, not a text"),
    ([{"field": "dtype", "op": "eq"}], "condition 1: value is missing"),
    ([{"field": "dtype", "op": "eq", "value": "tf32", "why": 1}], "unknown key 'why'"),
    ([{"field": "DType", "op": "eq", "value": "tf32"}], "field 'DType' must be lower-case"),
    ([{"field": 3, "op": "eq", "value": "tf32"}], "field a number must be lower-case"),
    ([{"field": "dtype", "op": "like", "value": "tf"}], "op 'like' is not one of eq, ne, in"),
    ([{"field": "dtype", "op": ["eq"], "value": "tf"}], "op a list is not one of eq, ne, in"),
    ([{"field": "seq_len", "op": ">=", "value": "long"}],
     "op '>=' compares numbers: value must be a finite number, not a text"),
    ([{"field": "seq_len", "op": ">=", "value": True}], "value must be a finite number"),
    ([{"field": "dtype", "op": "in", "value": []}], "needs a list of 1 to 50 values, not 0"),
    ([{"field": "dtype", "op": "in", "value": "fp32"}], "needs a list of 1 to 50 values"),
    ([{"field": "dtype", "op": "in", "value": ["fp32", True]}],
     "value 2: must be a string or a number, not a boolean"),
    ([{"field": "dtype", "op": "eq", "value": {"a": 1}}], "value: must be a string, boolean"),
    ([{"field": "dtype", "op": "eq", "value": ""}], "value: must be a non-empty text"),
    ([{"field": "x", "op": "eq", "value": 1}] * 21, "at most 20 conditions, not 21"),
], ids=["not-a-list", "not-an-object", "missing-value", "unknown-key", "bad-field",
        "field-not-text", "unknown-op", "op-not-text", "number-op-on-text", "number-op-on-boolean",
        "empty-in", "in-without-list", "boolean-in-list", "object-value", "empty-text",
        "too-many"])
def test_malformed_conditions_are_refused_in_words(raw: object, expected: str) -> None:
    problems = predicate_problems(raw)

    assert any(expected in problem for problem in problems), problems
    with pytest.raises(PredicateError) as caught:
        validate_predicates(raw)
    assert caught.value.problems == problems


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)
CONDITION = st.fixed_dictionaries({"field": JSON | st.sampled_from(["dtype", "seq_len"]),
                                   "op": JSON | st.sampled_from(sorted(OPS)), "value": JSON})


@examples(max_examples=300, deadline=None, database=None)
@given(st.lists(CONDITION | JSON, max_size=4) | JSON)
def test_any_json_gets_problems_in_words_or_predicates_never_an_exception(raw: Any) -> None:
    problems = predicate_problems(raw)

    assert all(isinstance(problem, str) and problem for problem in problems)
    if not problems:
        predicates = validate_predicates(raw)
        assert len(evaluate(predicates, METADATA)) == len(predicates)


def test_every_problem_of_a_list_is_named_with_its_condition() -> None:
    problems = predicate_problems([{"field": "dtype", "op": "eq", "value": "tf32"},
                                   {"field": "x", "op": "??", "value": 1}, {"op": "eq"}])

    assert [p.split(":")[0] for p in problems] == ["condition 2", "condition 3", "condition 3"]
    assert problems[1:] == ["condition 3: field is missing", "condition 3: value is missing"]


def test_valid_conditions_become_predicates_that_read_as_words() -> None:
    predicates = validate_predicates([
        {"field": "dtype", "op": "in", "value": ["fp32", "tf32"]},
        {"field": "seq_len", "op": ">=", "value": 1024},
        {"field": "bottleneck", "op": "ne", "value": "gil"}])

    assert [p.describe() for p in predicates] == [
        "dtype is one of fp32, tf32", "seq_len ≥ 1024", "bottleneck is not gil"]


METADATA = {"probe": "cp-check", "layer": "correctness", "op_class": "merge", "dtype": "FP32",
            "seq_len": [256, 4096], "tokens": "2048", "fused": True,
            "bottleneck": [PRECISION, "compute"]}


@pytest.mark.parametrize(("field", "op", "value", "state"), [
    ("op_class", "eq", "merge", MET),
    ("op_class", "eq", "scan", NOT_MET),
    ("dtype", "in", ["tf32", "fp32"], MET),  # text without regard to case
    ("dtype", "not_in", ["fp32"], NOT_MET),
    ("dtype", "ne", "bf16", MET),
    ("seq_len", ">=", 1024, MET),  # any of the sizes the probe covers
    ("seq_len", ">", 8192, NOT_MET),
    ("seq_len", "eq", 4096, MET),
    ("tokens", "<=", 2048, MET),  # numbers as numbers, written as text
    ("fused", "eq", True, MET),
    ("bottleneck", "eq", "precision", MET),
    ("bottleneck", "not_in", ["gil", "serialized-threads"], MET),
    ("head_dim", "<=", 128, UNKNOWN),  # nothing known: never silently true
    ("op_class", ">=", 3, UNKNOWN),  # a number asked of a text
], ids=["eq-met", "eq-not-met", "in-any-case", "not-in", "ne", "list-any", "list-none",
        "list-eq", "numeric-text", "boolean", "measured", "not-in-list", "missing-field",
        "not-a-number"])
def test_each_condition_is_met_not_met_or_unknown(field: str, op: str, value: Any,
                                                  state: str) -> None:
    [check] = evaluate([Predicate(field, op, value)], METADATA)

    assert check.state == state, check


def test_an_unknown_field_is_reported_and_does_not_match() -> None:
    predicates = validate_predicates([{"field": "op_class", "op": "eq", "value": "merge"},
                                      {"field": "head_dim", "op": "<=", "value": 128}])

    matched, checks = matches(predicates, METADATA)

    assert matched is False
    assert [c.state for c in checks] == [MET, UNKNOWN]
    assert "no head_dim is known for this probe" in str(checks[1])
    assert matches(predicates[:1], METADATA)[0] is True


def finding(kind: str, probe: str, title: str = "", **evidence: Any) -> dict[str, Any]:
    return {"layer": "x", "kind": kind, "severity": "warn", "title": title or kind,
            "detail": "", "evidence": {"probe": probe, **evidence}}


def test_feedback_names_the_bottlenecks_it_measured_on_the_probe() -> None:
    growing = finding("error-vs-size", "cp-check", series={"growing": True, "slope": 0.4})
    flat = finding("error-vs-size", "cp-check", series={"growing": False})
    apart = finding("no-overlap", "prefill-kv", "dispatch never overlaps kv_transfer")
    fixed = finding("fixed", "cp-check", baseline=[growing])

    facts = measured_facts([(7, {"findings": [flat, apart]}), (9, {"findings": [fixed]})])
    only_cp = measured_facts([(7, {"findings": [flat, apart]}), (9, {"findings": [fixed]})],
                             "cp-check")

    assert [(f.field, f.value) for f in facts] == [("bottleneck", SERIALIZED),
                                                   ("bottleneck", PRECISION)]
    assert facts[0].source == "experiment 7: dispatch never overlaps kv_transfer"
    assert [f.value for f in only_cp] == [PRECISION]
    assert measured_facts([(1, {"findings": [flat]})]) == []


def test_a_probes_meta_and_measured_facts_make_its_metadata() -> None:
    manifest = parse_manifest("""
[[probe]]
name = "cp-check"
layer = "correctness"
command = "python3 check.py"
covers = ["kda/**"]
meta = {op_class = "merge", dtype = "fp32", seq_len = [1024, 65536], bottleneck = "compute"}
""")
    probe = manifest.probes[0]
    facts = measured_facts([(3, {"findings": [
        finding("error-vs-size", "cp-check", series={"growing": True})]})])

    metadata = with_facts(probe_metadata(probe), facts)

    assert metadata == {"probe": "cp-check", "layer": "correctness", "covers": ["kda/**"],
                        "op_class": "merge", "dtype": "fp32", "seq_len": (1024, 65536),
                        "bottleneck": ["compute", PRECISION]}


@pytest.mark.parametrize(("meta", "expected"), [
    ("meta = 3", "meta must be a table of facts"),
    ("meta = {OpClass = 'merge'}", "meta key 'OpClass' must be lower-case letters"),
    ("meta = {layer = 'performance'}", "meta.layer repeats the probe's own layer"),
    ("meta = {seq_len = []}", "meta.seq_len must list from 1 to 50 values, got 0"),
    ("meta = {shape = [[1, 2]]}", "meta.shape must list strings or numbers only"),
    ("meta = {scale = inf}", "meta.scale must be a finite number"),
    ("meta = {op_class = {a = 1}}", "must be a string, number, boolean or array, got a table"),
], ids=["not-a-table", "bad-key", "probe-field", "empty-array", "nested-array", "infinite",
        "table-value"])
def test_a_malformed_probe_meta_is_a_manifest_problem_with_its_line(meta: str,
                                                                   expected: str) -> None:
    text = f"[[probe]]\nname = 'p'\nlayer = 'correctness'\ncommand = 'true'\n{meta}\n"

    with pytest.raises(ManifestError) as caught:
        parse_manifest(text)

    [problem] = caught.value.problems
    assert expected in problem.message
    assert problem.line == 5


# --------------------------------------------------------------------------- statistics


def test_statistics_count_outcomes_and_give_the_median_gain_with_an_interval() -> None:
    rows = [("accepted", 1.71), ("accepted", 1.10), ("accepted", 1.30), ("rejected", None),
            ("applied", None), ("accepted", None)]

    stats = UsageStats.of(rows)

    assert (stats.applied, stats.accepted, stats.rejected, stats.open) == (6, 4, 1, 1)
    assert stats.gains == (1.71, 1.10, 1.30)
    assert stats.median_gain == pytest.approx(1.30)
    assert stats.low is not None and stats.high is not None and stats.median_gain is not None
    assert 1.10 <= stats.low <= stats.median_gain <= stats.high <= 1.71
    assert stats == UsageStats.of(rows)  # a fixed seed: the same interval every time
    assert "median gain 1.30x (95% CI" in stats.describe()


def test_too_few_gains_give_no_interval_and_say_so() -> None:
    stats = UsageStats.of([("accepted", 1.5), ("accepted", 1.2)])

    assert stats.median_gain == pytest.approx(1.35)
    assert stats.low is None
    assert "too few for an interval" in stats.describe()
    assert UsageStats.of([]).describe() == "not applied yet"


# --------------------------------------------------------------------------- the seeds


@pytest.mark.django_db
def test_the_three_techniques_of_the_cases_are_seeded_as_reviewed() -> None:
    seeded = {s.slug: s for s in Skeleton.objects.filter(slug__in=SEEDED)}

    assert set(seeded) == set(SEEDED)
    for skeleton in seeded.values():
        assert skeleton.status == Skeleton.Status.REVIEWED
        assert skeleton.predicates(), skeleton.slug
        assert skeleton.provenance_url.startswith("https://github.com/")
    assert "fla-org/flash-linear-attention" in seeded["higher-precision-merge"].provenance
    assert "tf32x3" in seeded["higher-precision-merge"].transformation
    assert "deepseek-ai/DeepEP" in seeded["release-gil-around-native-waits"].provenance
    assert "gil_scoped_release" in seeded["release-gil-around-native-waits"].transformation
    assert "V-tiling" in seeded["fuse-per-tile-work"].provenance


# --------------------------------------------------------------------------- the world


def make_skeleton(slug: str, **fields: Any) -> Skeleton:
    values: dict[str, Any] = {
        "name": slug.replace("-", " ").capitalize(), "summary": f"The {slug} technique.",
        "transformation": f"Do {slug}.", "provenance": "a test",
        "applicability": [{"field": "layer", "op": "eq", "value": "performance"}]}
    return Skeleton.objects.create(slug=slug, **(values | fields))


def make_change(target: Target, title: str, **fields: Any) -> Change:
    diff = f"--- a/x\n+++ b/x\n@@ -1 +1 @@\n-{title}\n+{title}!\n"
    return ChangeFactory.create(target=target, title=title, hypothesis=f"Because {title}.",
                                diff=diff, **fields)


def make_run(target: Target, owner: User, policy: str = "llm") -> AgentRun:
    goal = GoalFactory.create(target=target, name=f"goal {Goal.objects.count()}", owner=owner,
                              policy=policy, boundary__editable_paths="serving/**",
                              snapshot_by=owner)
    return AgentRunFactory.create(goal=goal, started_by=owner, base_commit="a" * 40)


@pytest.fixture
def world(db: None) -> dict[str, Any]:
    """Two targets; Mia is an engineer on the first only. Each target has a run that applied
    the same skeleton, a change and an experiment that are its evidence, and a draft proposed
    from its change."""
    mine = TargetFactory.create(name="mine")
    theirs = TargetFactory.create(name="theirs")
    owen = UserFactory.create(username="owen", roles=["engineer"], member_of=[theirs])
    mia = member(UserFactory.create(username="mia", roles=["engineer"], member_of=[]), mine,
                 "engineer")
    skeleton = make_skeleton("shared-trick")
    made: dict[str, Any] = {"mia": mia, "owen": owen, "skeleton": skeleton}
    for name, target in (("mine", mine), ("theirs", theirs)):
        change = make_change(target, f"{name} secret change title", status=Change.Status.MERGED)
        experiment = ExperimentFactory.create(target=target, status="succeeded")
        run = make_run(target, owen if name == "theirs" else mia)
        SkeletonUse.objects.create(skeleton=skeleton, run=run, change=change,
                                   outcome=SkeletonUse.Outcome.ACCEPTED, gain=1.5)
        SkeletonEvidence.objects.create(skeleton=skeleton, change=change, experiment=experiment)
        draft = make_skeleton(f"{name}-draft", status=Skeleton.Status.DRAFT,
                              name=f"Draft of the {name} change", proposed_from=change)
        made[name] = {"target": target, "change": change, "experiment": experiment,
                      "run": run, "draft": draft}
    return made


@pytest.fixture
def mia(client: Client, world: dict[str, Any]) -> Client:
    client.force_login(world["mia"])
    return client


# --------------------------------------------------------------------------- pages


def test_the_list_shows_the_library_with_conditions_in_words_and_records(mia: Client) -> None:
    page = mia.get("/skeletons/")

    text = page.content.decode()
    assert page.status_code == 200
    for slug in (*SEEDED, "shared-trick"):
        assert f'href="/skeletons/{slug}/"' in text
    assert "bottleneck is one of serialized-threads, gil" in text
    assert "Applied 2 times: 2 accepted, 0 rejected, 0 open" in text
    assert 'href="/skeletons/"' in text  # the navigation's link


@pytest.mark.parametrize(("query", "shown", "hidden"), [
    ("q=GIL", ["release-gil-around-native-waits"], ["higher-precision-merge"]),
    ("q=tf32x3", ["higher-precision-merge"], ["fuse-per-tile-work"]),
    ("status=draft", ["mine-draft"], ["higher-precision-merge"]),
    ("field=op_class", ["fuse-per-tile-work", "higher-precision-merge"],
     ["release-gil-around-native-waits", "shared-trick"]),
    ("q=warp&status=reviewed&field=bottleneck", ["fuse-per-tile-work"],
     ["higher-precision-merge"]),
], ids=["words", "transformation", "status", "field", "all-three"])
def test_the_search_and_filters_narrow_the_list(mia: Client, query: str, shown: list[str],
                                                hidden: list[str]) -> None:
    text = mia.get(f"/skeletons/?{query}").content.decode()

    for slug in shown:
        assert f'href="/skeletons/{slug}/"' in text, slug
    for slug in hidden:
        assert f'href="/skeletons/{slug}/"' not in text, slug


def test_a_filter_it_cannot_read_is_named_and_ignored_never_a_500(mia: Client) -> None:
    page = mia.get("/skeletons/?status=golden&field=no_such_field&q=" + "x" * 300)

    text = page.content.decode()
    assert page.status_code == 200
    assert "“golden” is not a status." in text
    assert "no skeleton has a condition on “no_such_field”." in text
    assert "a search is at most 200 characters." in text
    assert 'href="/skeletons/higher-precision-merge/"' in text


def test_an_htmx_search_gets_only_the_table(mia: Client) -> None:
    page = mia.get("/skeletons/?q=GIL", headers={"HX-Request": "true",
                                                 "HX-Target": "skeleton-table"})

    text = page.content.decode()
    assert text.lstrip().startswith('<div id="skeleton-table">')
    assert "release-gil-around-native-waits" in text and "<nav" not in text


def test_the_detail_page_says_everything_about_a_skeleton(mia: Client) -> None:
    text = mia.get("/skeletons/higher-precision-merge/").content.decode()

    for part in ("op_class is one of merge, scan, matmul", "dtype is one of fp32, tf32",
                 "bottleneck is precision", "input_precision=&quot;tf32x3&quot;",
                 "What it costs", "three times the tensor-core work",
                 'href="https://github.com/fla-org/flash-linear-attention/pull/1180"',
                 "Not applied yet.", "once a run applied it and its change merged with a "
                 "verified gain"):
        assert part in text, part
    assert "Promote to" not in text


def test_a_reader_sees_only_the_evidence_and_uses_of_their_own_targets(
        mia: Client, world: dict[str, Any]) -> None:
    text = mia.get("/skeletons/shared-trick/").content.decode()

    mine, theirs = world["mine"], world["theirs"]
    assert f'href="/reviews/changes/{mine["change"].pk}/"' in text
    assert f'href="/experiments/{mine["experiment"].pk}/"' in text
    assert f'href="/runs/{mine["run"].pk}/"' in text
    assert "theirs secret change title" not in text
    assert f'href="/experiments/{theirs["experiment"].pk}/"' not in text
    assert f'href="/runs/{theirs["run"].pk}/"' not in text
    assert "Applied 2 times: 2 accepted" in text  # the counts are the library's


def test_a_draft_from_another_targets_change_is_not_found_anywhere(
        mia: Client, world: dict[str, Any]) -> None:
    assert mia.get("/skeletons/theirs-draft/").status_code == 404
    assert mia.get("/skeletons/no-such-skeleton/").status_code == 404
    assert mia.post("/skeletons/theirs-draft/promote/",
                    {"expected": "draft"}).status_code == 404
    listed = mia.get("/skeletons/?status=draft").content.decode()
    assert "Draft of the mine change" in listed
    assert "Draft of the theirs change" not in listed
    own = mia.get("/skeletons/mine-draft/").content.decode()
    assert f'href="/reviews/changes/{world["mine"]["change"].pk}/"' in own
    admin = mia.get("/admin/skeletons/skeleton/").content.decode()
    assert "Draft of the mine change" in admin and "Draft of the theirs change" not in admin
    draft = world["theirs"]["draft"]
    assert mia.get(f"/admin/skeletons/skeleton/{draft.pk}/change/").status_code == 404


def test_an_engineer_promotes_a_draft_once_and_a_stale_page_changes_nothing(
        mia: Client, world: dict[str, Any]) -> None:
    first = mia.post("/skeletons/mine-draft/promote/", {"expected": "draft"}, follow=True)
    again = mia.post("/skeletons/mine-draft/promote/", {"expected": "draft"}, follow=True)

    draft = Skeleton.objects.get(slug="mine-draft")
    assert draft.status == Skeleton.Status.REVIEWED
    assert draft.promoted_by == world["mia"]
    assert "is reviewed now." in first.content.decode()
    assert "This skeleton is reviewed now, not draft" in again.content.decode()
    [entry] = AuditEntry.objects.filter(action="skeleton.promote")
    assert entry.data == {"from": "draft", "to": "reviewed"}
    assert entry.actor == world["mia"]


def test_trust_needs_a_verified_gain(mia: Client, world: dict[str, Any]) -> None:
    refused = mia.post("/skeletons/higher-precision-merge/promote/", {"expected": "reviewed"},
                       follow=True)
    trusted = mia.post("/skeletons/shared-trick/promote/", {"expected": "draft"}, follow=True)

    assert "once a run applied it and its change merged with a verified gain" in \
        refused.content.decode()
    assert Skeleton.objects.get(slug="higher-precision-merge").status == "reviewed"
    assert "is reviewed now." in trusted.content.decode()
    mia.post("/skeletons/shared-trick/promote/", {"expected": "reviewed"})
    assert Skeleton.objects.get(slug="shared-trick").status == Skeleton.Status.TRUSTED
    last = mia.post("/skeletons/shared-trick/promote/", {"expected": "trusted"}, follow=True)
    assert "A trusted skeleton cannot be promoted" in last.content.decode()


@pytest.mark.parametrize("posted", [{}, {"expected": "golden"}], ids=["nothing", "unknown"])
def test_a_malformed_promotion_says_so_and_changes_nothing(mia: Client,
                                                           posted: dict[str, str]) -> None:
    page = mia.post("/skeletons/mine-draft/promote/", posted, follow=True)

    assert page.status_code == 200
    assert "The page is out of date" in page.content.decode()
    assert Skeleton.objects.get(slug="mine-draft").status == Skeleton.Status.DRAFT


def test_a_viewer_reads_the_library_but_may_not_promote(client: Client,
                                                        world: dict[str, Any]) -> None:
    vic = member(UserFactory.create(username="vic", roles=["viewer"], member_of=[]),
                 world["mine"]["target"], "viewer")
    client.force_login(vic)

    page = client.get("/skeletons/mine-draft/").content.decode()
    refused = client.post("/skeletons/mine-draft/promote/", {"expected": "draft"})

    assert "Only an engineer or a reviewer promotes a skeleton." in page
    assert "Promote to" not in page
    assert refused.status_code == 403
    assert "Only an engineer or a reviewer promotes a skeleton." in refused.content.decode()
    assert Skeleton.objects.get(slug="mine-draft").status == Skeleton.Status.DRAFT


def test_without_a_role_the_library_is_closed(client: Client, db: None) -> None:
    client.force_login(UserFactory.create(username="nobody", member_of=[]))

    assert client.get("/skeletons/").status_code == 403
    assert client.get("/skeletons/higher-precision-merge/").status_code == 403


# --------------------------------------------------------------------------- admin


def skeleton_form(**changes: str) -> dict[str, str]:
    return {"name": "Pin the batch", "slug": "pin-the-batch", "summary": "Pin it.",
            "applicability": '[{"field": "layer", "op": "eq", "value": "e2e"}]',
            "applicability_prose": "", "transformation": "Pin the batch size.",
            "resource_constraints": "", "provenance": "a person", "provenance_url": "",
            **changes}


@pytest.mark.parametrize(("conditions", "expected"), [
    ("[{'field': 'x'}]", "This is not JSON: write a list of conditions in double quotes"),
    ('{"field": "x"}', "the conditions must be a list of objects"),
    ('[{"field": "dtype", "op": "like", "value": 1}]',
     "condition 1: op &#x27;like&#x27; is not one of eq, ne, in"),
], ids=["not-json", "not-a-list", "unknown-op"])
def test_the_admin_refuses_bad_conditions_in_words(mia: Client, conditions: str,
                                                   expected: str) -> None:
    page = mia.post("/admin/skeletons/skeleton/add/", skeleton_form(applicability=conditions))

    assert page.status_code == 200
    assert expected in page.content.decode()
    assert not Skeleton.objects.filter(slug="pin-the-batch").exists()


def test_the_admin_adds_a_draft_by_its_author_audited(mia: Client,
                                                      world: dict[str, Any]) -> None:
    page = mia.post("/admin/skeletons/skeleton/add/", skeleton_form(applicability=""))

    assert page.status_code == 302, page.content.decode()[:2000]
    skeleton = Skeleton.objects.get(slug="pin-the-batch")
    assert (skeleton.status, skeleton.applicability) == (Skeleton.Status.DRAFT, [])
    assert skeleton.created_by == world["mia"]
    assert AuditEntry.objects.filter(action="skeleton.add", object_id=str(skeleton.pk)).exists()


# --------------------------------------------------------------------------- outcomes


def perf(probe: str, metric: str, ratio: float, verdict: str = "improved",
         direction: str = "minimize") -> dict[str, Any]:
    """A performance finding as infraops.feedback.findings writes it, with its comparison."""
    return {"layer": "performance", "kind": "perf-comparison",
            "severity": {"improved": "pass", "regressed": "fail", "no change": "info"}.get(
                verdict, "warn"),
            "title": f"{probe} {metric} {verdict}", "detail": "", "specificity": 20,
            "evidence": {"probe": probe, "metric": metric,
                         "comparison": {"verdict": verdict, "ratio": ratio,
                                        "direction": direction}}}


@pytest.mark.parametrize(("findings", "gain"), [
    ([perf("bench", "ms", 0.8)], 1.25),
    ([perf("bench", "ms", 0.8), perf("bench", "ms", 0.5)], pytest.approx(1.625)),
    ([perf("bench", "tps", 1.4, direction="maximize")], None),  # another metric
    ([perf("bench", "ms", 0.8), perf("bench", "ms", 1.3, "regressed")], None),
    ([perf("bench", "ms", 0.99, "no change")], None),
    ([], None),
], ids=["one-cell", "median-of-cells", "other-metric", "a-cell-regressed", "no-change",
        "nothing"])
def test_a_gain_is_verified_only_by_an_improvement_of_the_goals_metric(
        findings: list[dict[str, Any]], gain: Any) -> None:
    assert verified_gain(findings, probe="bench", metric="ms") == gain


@pytest.fixture
def delivered() -> Iterator[Callable[[], list[int]]]:
    """deliver(): the skeleton outcome tasks sent so far (after their commits), each run in
    this process as a worker runs it when the message arrives; returns their change ids. The
    messages are taken back off the broker after the test: a worker of a later test must not
    act on this test's change ids in its own database."""
    sent: list[int] = []
    message_ids: set[str] = set()

    def on_publish(sender: Any = None, body: Any = None, headers: Any = None,
                   **kwargs: Any) -> None:
        if sender == skeleton_outcome.name:
            sent.append(int(body[0][0]))
            message_ids.add(headers["id"])

    def deliver() -> list[int]:
        for change_id in sent:
            skeleton_outcome(change_id)
        return list(sent)

    before_task_publish.connect(on_publish, weak=False)
    yield deliver
    before_task_publish.disconnect(on_publish)
    broker = redis.Redis.from_url(django_settings.CELERY_BROKER_URL, decode_responses=True)
    for raw in broker.lrange(OUTCOME_QUEUE, 0, -1):
        if json.loads(raw).get("headers", {}).get("id") in message_ids:
            broker.lrem(OUTCOME_QUEUE, 1, str(raw))


@pytest.fixture
def merged_by_a_run(example_target: Target, engineer: User, tmp_path: Path,
                    monkeypatch: pytest.MonkeyPatch,
                    django_capture_on_commit_callbacks: Callable[..., Any],
                    delivered: Callable[[], list[int]]
                    ) -> Iterator[Callable[..., tuple[AgentRun, Change]]]:
    """merge(policy=, uses=, ratio=, verdict=): a run of an auto-merge goal applies `uses`
    skeletons, submits an engine edit whose evidence gives latency that ratio and verdict,
    and the change merges (its outcome recorded after the commit)."""

    def merge(*, policy: str = "llm", uses: tuple[str, ...] = (), ratio: float = 0.8,
              verdict: str = "improved") -> tuple[AgentRun, Change]:
        goal = GoalFactory.create(target=example_target, name=f"latency {policy}",
                                  probe="latency-bench", metric="latency_ms", policy=policy,
                                  auto_merge=True, owner=engineer,
                                  boundary__editable_paths="serving/**",
                                  criteria=[LATENCY_CRITERION], snapshot_by=engineer)
        version: GoalVersion = goal.versions.get()
        repo = example_target.clone_path
        base = gitops.rev_parse(repo, "refs/heads/main")
        head = commit_files(repo, base, ENGINE_EDIT, tmp_path)
        run = AgentRunFactory.create(goal_version=version, started_by=engineer,
                                     base_commit=base)
        for slug in uses:
            SkeletonUse.objects.create(skeleton=Skeleton.objects.get(slug=slug), run=run,
                                       note="applied to serving/engine.py")
        experiment = ExperimentFactory.create(
            target=example_target, status="succeeded", candidate_commit=head,
            baseline_commit=base, probes=["latency-bench"], finished_at=timezone.now(),
            feedback={"findings": [criterion_finding(version.spec["criteria"][0]),
                                   perf("latency-bench", "latency_ms", ratio, verdict)]})
        # The submission's after-commit work runs (the library ties the run's uses to the
        # change), except the merge task it enqueues: the test advances the change itself.
        with monkeypatch.context() as patched:
            patched.setattr(change_advance_task, "delay", lambda change_id: None)
            with django_capture_on_commit_callbacks(execute=True):
                change = submit_change(run, title="Cheaper requests", hypothesis="Less work "
                                       "per request lowers latency.\nMeasured on latency-bench.",
                                       experiment=experiment, head_commit=head)
        assert change.status == Change.Status.MERGING, change.failing_checks
        with django_capture_on_commit_callbacks(execute=True):
            change = change_advance(change_id=change.pk)
        assert change.status == Change.Status.MERGED
        assert delivered() == [change.pk]  # one outcome task, sent after the merge committed
        return run, change

    yield merge


def commit_files(repo: Path, base: str, files: dict[str, str], tmp_path: Path) -> str:
    tree = tmp_path / f"tree-{base[:8]}-{len(list(tmp_path.iterdir()))}"
    gitops.worktree_add(repo, tree, base)
    for name, text in files.items():
        (tree / name).write_text(text)
    head = gitops.commit_all(tree, "candidate", author_name="agent", author_email="a@a.test")
    gitops.worktree_remove(repo, tree)
    assert head is not None
    return head


def test_a_merge_accepts_the_runs_use_with_its_gain_and_makes_it_evidence(
        merged_by_a_run: Callable[..., tuple[AgentRun, Change]]) -> None:
    run, change = merged_by_a_run(uses=("fuse-per-tile-work",))

    use = SkeletonUse.objects.get(run=run)
    assert use.change == change  # tied when the run submitted it
    assert use.outcome == SkeletonUse.Outcome.ACCEPTED
    assert use.gain == pytest.approx(1.25)
    assert use.decided_at is not None
    skeleton = Skeleton.objects.get(slug="fuse-per-tile-work")
    [evidence] = skeleton.evidence.all()
    assert (evidence.change, evidence.experiment) == (change, change.experiment)
    assert skeleton.usage().describe().startswith("applied 1 time: 1 accepted")
    assert not Skeleton.objects.filter(proposed_from=change).exists()


def test_a_merge_with_a_gain_and_no_skeleton_proposes_a_draft_once(
        merged_by_a_run: Callable[..., tuple[AgentRun, Change]]) -> None:
    _run, change = merged_by_a_run()

    draft = Skeleton.objects.get(proposed_from=change)
    assert draft.status == Skeleton.Status.DRAFT
    assert draft.name == "Cheaper requests"
    assert draft.summary == "Less work per request lowers latency."
    assert "Measured on latency-bench." in draft.transformation
    assert draft.provenance == f"change #{change.pk}"
    assert draft.applicability == [{"field": "layer", "op": "eq", "value": "performance"}]
    assert "1.25x better" in draft.applicability_prose
    assert list(draft.evidence.values_list("change", "experiment")) == [
        (change.pk, change.experiment_id)]
    skeleton_outcome_record(change_id=change.pk)  # a second delivery of the task
    assert Skeleton.objects.filter(proposed_from=change).count() == 1
    assert SkeletonEvidence.objects.filter(change=change).count() == 1


@pytest.mark.parametrize("merge", [{"policy": "tuner"},
                                   {"ratio": 0.995, "verdict": "no change"},
                                   {"ratio": 0.9, "verdict": "inconclusive"}],
                         ids=["a-tuned-knob", "no-change", "inconclusive"])
def test_no_draft_without_a_reusable_verified_gain(
        merged_by_a_run: Callable[..., tuple[AgentRun, Change]],
        merge: dict[str, Any]) -> None:
    _run, change = merged_by_a_run(**merge)

    assert not Skeleton.objects.filter(proposed_from=change).exists()
    assert not SkeletonEvidence.objects.filter(change=change).exists()


def test_a_merge_without_a_verified_gain_accepts_the_use_with_no_gain(
        merged_by_a_run: Callable[..., tuple[AgentRun, Change]]) -> None:
    run, _change = merged_by_a_run(uses=("release-gil-around-native-waits",), ratio=0.9,
                                   verdict="inconclusive")

    use = SkeletonUse.objects.get(run=run)
    assert (use.outcome, use.gain) == (SkeletonUse.Outcome.ACCEPTED, None)
    assert not use.skeleton.evidence.exists()
    assert use.skeleton.usage().describe().endswith("no verified gain yet")


def test_a_rejected_change_marks_its_runs_use_rejected(
        world: dict[str, Any], reviewer: User, delivered: Callable[[], list[int]],
        django_capture_on_commit_callbacks: Callable[..., Any]) -> None:
    target = world["mine"]["target"]
    member(reviewer, target, "reviewer")
    run = make_run(target, world["mia"])
    change = make_change(target, "Risky trick", requested_by=world["mia"])
    use = SkeletonUse.objects.create(skeleton=world["skeleton"], run=run, change=change)

    with django_capture_on_commit_callbacks(execute=True):
        review_decide(change=change, reviewer=reviewer, decision="reject",
                      comment="Not like this.")
    assert delivered() == [change.pk]

    use.refresh_from_db()
    assert (use.outcome, use.gain) == (SkeletonUse.Outcome.REJECTED, None)
    assert world["skeleton"].usage().rejected == 1
    assert not Skeleton.objects.filter(proposed_from=change).exists()


def test_an_undecided_change_records_nothing(world: dict[str, Any]) -> None:
    target = world["mine"]["target"]
    change = make_change(target, "Waiting")
    use = SkeletonUse.objects.create(skeleton=world["skeleton"],
                                     run=make_run(target, world["mia"]), change=change)

    assert skeleton_outcome_record(change_id=change.pk) == []
    assert skeleton_outcome_record(change_id=987654321) == []
    use.refresh_from_db()
    assert use.outcome == SkeletonUse.Outcome.APPLIED


def test_the_skeleton_page_shows_outcomes_as_they_come(
        merged_by_a_run: Callable[..., tuple[AgentRun, Change]],
        client: Client, engineer: User) -> None:
    run, change = merged_by_a_run(uses=("fuse-per-tile-work",))
    client.force_login(engineer)

    text = client.get("/skeletons/fuse-per-tile-work/").content.decode()

    assert "Applied 1 time: 1 accepted, 0 rejected, 0 open; gain 1.25x" in text
    assert f'href="/runs/{run.pk}/"' in text
    assert f'href="/reviews/changes/{change.pk}/"' in text
