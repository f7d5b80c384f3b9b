"""Records stay records in the admin, and every edit of a target, goal, boundary or criterion
is audited field by field. Real requests through the test client, as a browser would send."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from infraops.models import AcceptanceCriterion, AuditEntry, Boundary, Goal, Target
from infraops.services.goals import goal_snapshot
from reviews.models import ReviewComment, ReviewDecision, ReviewerProfile
from tests.factories import (
    AgentRunFactory,
    ChangeFactory,
    ExperimentFactory,
    GoalFactory,
    UserFactory,
)
from tests.infraops.test_admin import form_of, new_goal, with_criterion


@pytest.fixture
def editor(client: Client, engineer: User) -> Client:
    client.force_login(engineer)
    return client


@pytest.fixture
def superuser(client: Client, db: None) -> Client:
    """An admin with every permission: what the admin itself allows, not what a role lacks."""
    user = UserFactory.create(username="ada", roles=["engineer"])
    user.is_superuser = True
    user.save()
    client.force_login(user)
    return client


@pytest.fixture
def history(example_goal: Goal, engineer: User, reviewer: User) -> dict[str, Any]:
    """One of each record on the example goal: a run, an experiment, a change with a
    decision and a comment (the goal already has version 1 and its audit entry)."""
    version = example_goal.versions.get(number=1)
    run = AgentRunFactory.create(goal_version=version, started_by=engineer, policy="tuner",
                                 base_commit="a" * 40, manifest_sha256="b" * 64)
    experiment = ExperimentFactory.create(target=example_goal.target, candidate_commit="c" * 40,
                                          baseline_commit="a" * 40)
    change = ChangeFactory.create(
        goal=example_goal, goal_version=version, experiment=experiment,
        title="Tune batch_size=8", hypothesis="Bigger batches amortise.", base_commit="a" * 40,
        head_commit="c" * 40, diff="--- a/config/serving.toml\n+++ b/config/serving.toml\n",
        author_label="run 1", requested_by=engineer)
    decision = ReviewDecision.objects.create(change=change, reviewer=reviewer,
                                             decision="request_changes", comment="Smaller steps.",
                                             diff_sha256=change.diff_sha256,
                                             base_commit=change.base_commit)
    comment = ReviewComment.objects.create(change=change, author=reviewer,
                                           path="config/serving.toml", line=2,
                                           text="Why eight?", diff_sha256=change.diff_sha256)
    return {"goalversion": version, "agentrun": run, "experiment": experiment,
            "change": change, "decision": decision, "comment": comment,
            "auditentry": AuditEntry.objects.get(action="goal.version")}


RECORDS = [("infraops", "goalversion"), ("infraops", "experiment"), ("infraops", "auditentry"),
           ("agents", "agentrun"), ("reviews", "change")]


def entries(action: str) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action=action).order_by("pk"))


# --------------------------------------------------------------------------- records


def test_a_goal_version_cannot_be_deleted_through_the_admin(
    superuser: Client, history: dict[str, Any]
) -> None:
    version = history["goalversion"]
    url = f"/admin/infraops/goalversion/{version.pk}/delete/"

    assert superuser.get(url).status_code == 403
    response = superuser.post(url, {"post": "yes"})

    assert response.status_code == 403
    assert version.goal.versions.filter(pk=version.pk).exists()


@pytest.mark.parametrize(("app", "model"), RECORDS)
def test_a_record_list_shows_its_rows_without_the_bulk_delete_action(
    superuser: Client, history: dict[str, Any], app: str, model: str
) -> None:
    row = history[model]

    page = superuser.get(f"/admin/{app}/{model}/").content.decode()

    assert f"/admin/{app}/{model}/{row.pk}/change/" in page
    assert "delete_selected" not in page


@pytest.mark.parametrize(("app", "model"), RECORDS)
def test_a_record_is_view_only_and_its_bulk_delete_is_refused(
    superuser: Client, history: dict[str, Any], app: str, model: str
) -> None:
    row = history[model]
    manager = type(row)._default_manager
    before = manager.count()

    page = superuser.get(f"/admin/{app}/{model}/{row.pk}/change/")
    refused = [superuser.post(f"/admin/{app}/{model}/{row.pk}/change/", {}),
               superuser.post(f"/admin/{app}/{model}/{row.pk}/delete/", {"post": "yes"}),
               superuser.get(f"/admin/{app}/{model}/add/")]
    superuser.post(f"/admin/{app}/{model}/", {"action": "delete_selected", "index": "0",
                                              "_selected_action": [str(row.pk)], "post": "yes"})

    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()
    assert [r.status_code for r in refused] == [403, 403, 403]
    assert manager.count() == before
    assert manager.filter(pk=row.pk).exists()


def test_a_change_shows_its_decisions_and_comments_read_only(
    superuser: Client, history: dict[str, Any]
) -> None:
    page = superuser.get(f"/admin/reviews/change/{history['change'].pk}/change/")

    html = page.content.decode()
    assert "Smaller steps." in html
    assert "Why eight?" in html
    assert 'name="decisions-0-comment"' not in html
    assert 'name="comments-0-text"' not in html
    assert "decisions-0-DELETE" not in html


@pytest.mark.parametrize("model", ["target", "goal"])
def test_a_target_or_goal_with_history_cannot_be_deleted_and_the_page_says_why(
    superuser: Client, history: dict[str, Any], model: str
) -> None:
    obj = history["change"].target if model == "target" else history["change"].goal

    page = superuser.get(f"/admin/infraops/{model}/{obj.pk}/change/").content.decode()
    response = superuser.post(f"/admin/infraops/{model}/{obj.pk}/delete/", {"post": "yes"})

    assert "runs: 1" in page
    assert "changes: 1" in page
    assert "Records stay records, so it cannot be deleted." in page
    assert f"/admin/infraops/{model}/{obj.pk}/delete/" not in page
    assert response.status_code == 403
    assert Target.objects.filter(pk=history["change"].target_id).exists()
    assert Goal.objects.filter(pk=history["change"].goal_id).exists()
    assert not AuditEntry.objects.filter(action=f"{model}.delete").exists()


def test_a_goal_with_only_a_version_is_kept_too(superuser: Client, example_goal: Goal) -> None:
    response = superuser.post(f"/admin/infraops/goal/{example_goal.pk}/delete/",
                              {"post": "yes"})

    assert response.status_code == 403
    assert example_goal.versions.count() == 1


def test_a_target_with_no_history_can_be_deleted_and_the_deletion_is_audited(
    superuser: Client, example_target: Target
) -> None:
    url = f"/admin/infraops/target/{example_target.pk}/"
    page = superuser.get(f"{url}change/").content.decode()

    response = superuser.post(f"{url}delete/", {"post": "yes"})

    assert "None yet." in page
    assert f"{url}delete/" in page
    assert response.status_code == 302
    assert not Target.objects.filter(pk=example_target.pk).exists()
    [entry] = entries("target.delete")
    assert entry.object_id == str(example_target.pk)
    assert entry.data["deleted"]["name"] == "tiny-serving"
    assert entry.actor is not None and entry.actor.username == "ada"


@pytest.mark.parametrize("model", ["target", "goal"])
def test_targets_and_goals_have_no_bulk_delete_action(
    superuser: Client, example_goal: Goal, model: str
) -> None:
    obj = example_goal.target if model == "target" else example_goal

    page = superuser.get(f"/admin/infraops/{model}/").content.decode()

    assert f"/admin/infraops/{model}/{obj.pk}/change/" in page
    assert "delete_selected" not in page
    assert model == "goal" or "refresh_manifest" in page


# --------------------------------------------------------------------------- audit of edits


def test_an_edit_of_a_criterion_value_writes_one_entry_with_old_and_new(
    editor: Client, example_goal: Goal, engineer: User
) -> None:
    url = f"/admin/infraops/goal/{example_goal.pk}/change/"
    criterion = example_goal.criteria.get()

    editor.post(url, form_of(editor, url) | {"criteria-0-value": "-0.1"})

    [entry] = entries("criterion.change")
    assert entry.object_type == "infraops.acceptancecriterion"
    assert entry.object_id == str(criterion.pk)
    assert entry.data["changed"] == {"value": [-0.05, -0.1]}
    assert entry.data["goal"] == example_goal.pk
    assert entry.actor == engineer
    assert not entries("goal.change")
    assert not entries("boundary.change")
    assert [e.data["number"] for e in entries("goal.version")] == [1, 2]


def test_an_unchanged_save_writes_no_entry(editor: Client, example_goal: Goal) -> None:
    url = f"/admin/infraops/goal/{example_goal.pk}/change/"
    before = AuditEntry.objects.count()

    response = editor.post(url, form_of(editor, url))

    assert response.status_code == 302
    assert AuditEntry.objects.count() == before


def test_textarea_line_ends_from_a_browser_are_not_a_change(
    editor: Client, example_goal: Goal
) -> None:
    Boundary.objects.filter(goal=example_goal).update(editable_paths="config/**\nbench/**")
    goal_snapshot(goal=example_goal)
    url = f"/admin/infraops/goal/{example_goal.pk}/change/"
    fields = form_of(editor, url)
    assert fields["boundary-0-editable_paths"] == "config/**\nbench/**"
    before = AuditEntry.objects.count()

    editor.post(url, fields | {"boundary-0-editable_paths": "config/**\r\nbench/**"})

    assert AuditEntry.objects.count() == before


def test_an_edit_of_the_boundary_names_each_changed_field(editor: Client,
                                                          example_goal: Goal) -> None:
    url = f"/admin/infraops/goal/{example_goal.pk}/change/"

    editor.post(url, form_of(editor, url) | {"boundary-0-max_experiments": "3",
                                             "boundary-0-max_cost_usd": "25.50"})

    [entry] = entries("boundary.change")
    assert entry.object_id == str(example_goal.boundary.pk)
    assert entry.data["changed"] == {"max_experiments": [8, 3], "max_cost_usd": ["20.00", "25.50"]}


def test_an_edit_of_the_goal_writes_its_fields_and_keeps_the_version(
    editor: Client, example_goal: Goal, reviewer: User
) -> None:
    url = f"/admin/infraops/goal/{example_goal.pk}/change/"

    editor.post(url, form_of(editor, url) | {"auto_merge": "on", "owner": str(reviewer.pk)})

    [entry] = entries("goal.change")
    assert entry.data["changed"] == {"owner": [example_goal.owner_id, reviewer.pk],
                                     "auto_merge": [False, True]}
    assert [e.data["number"] for e in entries("goal.version")] == [1, 2]
    assert example_goal.versions.get(number=2).spec["auto_merge"] is True


def test_the_goal_list_and_form_show_auto_merge(editor: Client, example_goal: Goal) -> None:
    listing = editor.get("/admin/infraops/goal/").content.decode()
    fields = form_of(editor, f"/admin/infraops/goal/{example_goal.pk}/change/")

    assert "Merge automatically" in listing
    assert "auto_merge" not in fields  # an unticked box: present on the page, not submitted
    assert 'name="auto_merge"' in editor.get(
        f"/admin/infraops/goal/{example_goal.pk}/change/").content.decode()


def test_a_deleted_criterion_is_audited_with_its_description(editor: Client,
                                                             example_goal: Goal) -> None:
    url = f"/admin/infraops/goal/{example_goal.pk}/change/"
    criterion = example_goal.criteria.get()

    editor.post(url, form_of(editor, url) | {"criteria-0-DELETE": "on"})

    assert not AcceptanceCriterion.objects.filter(pk=criterion.pk).exists()
    [entry] = entries("criterion.delete")
    assert entry.object_id == str(criterion.pk)
    assert entry.data["description"] == "latency-bench.latency_ms vs baseline <= -5.0%"
    assert entry.data["deleted"]["value"] == -0.05
    assert not entries("criterion.change")


def test_an_added_criterion_is_audited_with_its_values(editor: Client,
                                                       example_goal: Goal) -> None:
    url = f"/admin/infraops/goal/{example_goal.pk}/change/"
    fields = form_of(editor, url) | {
        "criteria-TOTAL_FORMS": "2", "criteria-1-kind": "threshold",
        "criteria-1-probe": "latency-bench", "criteria-1-metric": "latency_ms",
        "criteria-1-comparison": "<=", "criteria-1-value": "12",
    }

    editor.post(url, fields)

    [entry] = entries("criterion.add")
    added = example_goal.criteria.get(kind="threshold")
    assert entry.object_id == str(added.pk)
    assert entry.data["description"] == "latency-bench.latency_ms <= 12"
    assert entry.data["created"]["value"] == 12.0
    assert not entries("criterion.change")


def test_adding_a_goal_writes_one_entry_per_object(editor: Client,
                                                   example_target: Target) -> None:
    fields = with_criterion(new_goal(editor, example_target))

    editor.post("/admin/infraops/goal/add/", fields)

    goal = Goal.objects.get(name="throughput")
    assert sorted(e.action for e in AuditEntry.objects.filter(actor__isnull=False)) == [
        "boundary.add", "criterion.add", "goal.add", "goal.version"]
    [added] = entries("goal.add")
    assert added.object_id == str(goal.pk)
    assert added.data["created"]["probe"] == "latency-bench"
    assert added.data["created"]["target"] == example_target.pk


def test_an_edit_of_a_target_names_old_and_new_values(editor: Client,
                                                      example_target: Target) -> None:
    url = f"/admin/infraops/target/{example_target.pk}/change/"
    fields = form_of(editor, url)
    assert fields.pop("push_on_merge") == "on"

    response = editor.post(url, fields | {"name": "tiny"})

    assert response.status_code == 302
    [entry] = entries("target.change")
    assert entry.data["changed"] == {"name": ["tiny-serving", "tiny"],
                                     "push_on_merge": [True, False]}
    before = AuditEntry.objects.count()
    editor.post(url, form_of(editor, url))
    assert AuditEntry.objects.count() == before


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(("changes", "message"), [
    ({"boundary-0-max_steps": "99999999999"}, "less than or equal to"),
    ({"boundary-0-max_cost_usd": "1e12"}, "digits in total"),
    ({"boundary-0-max_cost_usd": "NaN"}, "Enter a number."),
    ({"criteria-0-value": "inf"}, "Enter a number."),
    ({"criteria-0-value": "much"}, "Enter a number."),
    ({"relative_target": "nan"}, "Enter a number."),
    ({"criteria-0-variant": "cp"}, "is not key=value"),
    ({"name": "twin"}, "already exists"),
])
def test_bad_input_on_a_goal_is_a_form_error(
    editor: Client, example_goal: Goal, changes: dict[str, str], message: str
) -> None:
    GoalFactory.create(target=example_goal.target, name="twin")
    url = f"/admin/infraops/goal/{example_goal.pk}/change/"
    before = AuditEntry.objects.count()

    response = editor.post(url, form_of(editor, url) | changes)

    assert response.status_code == 200
    assert message in response.content.decode()
    assert AuditEntry.objects.count() == before
    assert example_goal.versions.count() == 1


@pytest.mark.parametrize("field", ["repo_url", "base_branch"])
def test_a_target_field_that_git_would_read_as_an_option_is_refused(
    editor: Client, example_target: Target, field: str
) -> None:
    url = f"/admin/infraops/target/{example_target.pk}/change/"

    response = editor.post(url, form_of(editor, url) | {field: "--upload-pack=touch /tmp/x"})

    assert response.status_code == 200
    assert "This cannot begin with &#x27;-&#x27;." in response.content.decode()
    example_target.refresh_from_db()
    assert not example_target.repo_url.startswith("-")
    assert not entries("target.change")


# --------------------------------------------------------------------------- reviewer classes


def test_a_reviewer_is_assigned_risk_classes_and_the_assignment_is_audited(
    superuser: Client, reviewer: User
) -> None:
    fields = form_of(superuser, "/admin/reviews/reviewerprofile/add/")

    response = superuser.post("/admin/reviews/reviewerprofile/add/", fields | {
        "user": str(reviewer.pk), "risk_classes": ["production", "numerics"]})

    assert response.status_code == 302
    profile = ReviewerProfile.objects.get(user=reviewer)
    assert profile.risk_classes == ["numerics", "production"]
    [entry] = entries("reviewer.classes")
    assert entry.object_id == str(profile.pk)
    assert entry.data == {"user": "rae",
                          "created": {"user": reviewer.pk,
                                      "risk_classes": ["numerics", "production"]}}


def test_only_a_reviewer_can_be_given_risk_classes(superuser: Client, engineer: User) -> None:
    response = superuser.post("/admin/reviews/reviewerprofile/add/", {
        "user": str(engineer.pk), "risk_classes": ["numerics"]})

    assert response.status_code == 200
    assert "Choose a user with the reviewer role" in response.content.decode()
    assert not ReviewerProfile.objects.exists()
    assert not entries("reviewer.classes")


def test_changing_a_reviewers_classes_records_old_and_new_and_a_no_op_records_nothing(
    superuser: Client, reviewer: User
) -> None:
    profile = ReviewerProfile.objects.create(user=reviewer, risk_classes=["numerics"])
    url = f"/admin/reviews/reviewerprofile/{profile.pk}/change/"

    superuser.post(url, {"risk_classes": ["numerics", "concurrency"]})
    superuser.post(url, {"risk_classes": ["concurrency", "numerics"]})
    refused = superuser.post(f"/admin/reviews/reviewerprofile/{profile.pk}/delete/",
                             {"post": "yes"})

    profile.refresh_from_db()
    assert profile.risk_classes == ["numerics", "concurrency"]
    [entry] = entries("reviewer.classes")
    assert entry.data["changed"] == {"risk_classes": [["numerics"], ["numerics", "concurrency"]]}
    assert refused.status_code == 403
    assert ReviewerProfile.objects.filter(pk=profile.pk).exists()
