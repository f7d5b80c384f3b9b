"""The change page as a pull request: the checks panel, highlighted diff, evidence beside it,
line comments that reach the agent, and bad input answered with a message."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import cast

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.templatetags.static import static
from django.test import Client
from django.test.utils import CaptureQueriesContext

from agents.policies.llm import _news
from infraops.errors import DomainError
from infraops.models import AuditEntry, Goal, GoalVersion, Target
from reviews.models import Change, ReviewComment, ReviewDecision
from reviews.services import change_comment, review_decide
from reviews.services.submit import classify_diff
from tests.factories import AgentRunFactory
from tests.reviews.conftest import SERVING_TOML, CommitOn, criterion_finding, perf_finding
from tests.reviews.test_merge import move_main


def test_the_checks_panel_shows_each_check_with_its_reason(
    client: Client, reviewer: User, config_change: Change
) -> None:
    client.force_login(reviewer)

    page = client.get(f"/reviews/changes/{config_change.pk}/").content.decode()

    panel = page[page.index('<section id="gate-checks"'):page.index("</section>")]
    checks = dict(re.findall(r'data-check="([^"]+)">\s*<span class="mark" aria-label="(\w+)"',
                             panel))
    assert checks["auto-merge"] == "review"  # a reviewer decides: neutral, not failing
    assert checks["risk"] == "review"
    assert checks["analysed"] == "passed"
    assert checks["base"] == "passed"
    assert "this change merges only when a reviewer approves it" in panel
    assert "production: 2 findings (first config/serving.toml:2" in panel
    assert "the change has no pinned goal version" in panel


def test_the_checks_panel_is_also_an_htmx_fragment(client: Client, viewer: User,
                                                   config_change: Change) -> None:
    client.force_login(viewer)

    response = client.get(f"/reviews/changes/{config_change.pk}/", headers={"HX-Request": "true"})

    page = response.content.decode()
    assert page.lstrip().startswith('<section id="gate-checks"')
    assert "<html" not in page


def test_a_passing_change_shows_every_check_green_and_its_evidence(
    client: Client, viewer: User, passing_submit: Callable[..., Change]
) -> None:
    change = passing_submit()
    client.force_login(viewer)

    page = client.get(f"/reviews/changes/{change.pk}/").content.decode()

    assert f"All {len(change.gate)} checks passed" in page
    assert f'href="/experiments/{change.experiment_id}/"' in page
    assert 'id="auto-merge">on<' in page  # the goal version's setting, on the change page
    assert '<aside class="review-evidence"' in page
    assert "latency-bench.latency_ms vs baseline" in page  # the criteria table


def test_the_diff_is_syntax_highlighted(client: Client, viewer: User,
                                        passing_submit: Callable[..., Change]) -> None:
    change = passing_submit()
    client.force_login(viewer)

    page = client.get(f"/reviews/changes/{change.pk}/").content.decode()

    assert '<span class="hl-n">PER_REQUEST</span>' in page
    assert static("css/highlight.css") in page  # hashed once a standalone collected it


def test_a_line_comment_is_kept_shown_on_its_line_and_reaches_the_agent(
    client: Client, reviewer: User, config_change: Change, example_goal: Goal
) -> None:
    run = AgentRunFactory.create(goal=example_goal, policy="llm",
                                 started_by=cast(User, config_change.requested_by),
                                 base_commit=config_change.base_commit)
    run.changes.add(config_change)
    client.force_login(reviewer)
    form = client.get(f"/reviews/changes/{config_change.pk}/?comment=new:2:config/serving.toml")
    assert 'id="comment-form"' in form.content.decode()

    response = client.post(f"/reviews/changes/{config_change.pk}/comments/",
                           {"path": "config/serving.toml", "line": 2, "side": "new",
                            "text": "Batch 8 starves the KV transfer: measure e2e."}, follow=True)

    assert response.status_code == 200
    page = response.content.decode()
    assert "Batch 8 starves the KV transfer: measure e2e." in page
    assert ReviewComment.objects.get().line == 2
    news, marks = _news(run)
    assert marks["comments"] == [ReviewComment.objects.get().pk]
    assert any("config/serving.toml line 2" in n["content"] and "Batch 8 starves" in n["content"]
               for n in news)


def test_the_diff_tables_kept_between_reads_follow_comments_findings_and_the_readers_rights(
    client: Client, reviewer: User, viewer: User, config_change: Change
) -> None:
    """The tables are rendered once per process for each state of what they show: a read
    after a comment, a changed finding or by a reader who may not comment shows that state."""
    client.force_login(reviewer)
    url = f"/reviews/changes/{config_change.pk}/"
    first = client.get(url).content.decode()
    assert "Comment on this line" in first  # a reviewer's rows open the comment form

    change_comment(change=config_change, author=reviewer, path="config/serving.toml", line=2,
                   side="new", text="Measure the KV transfer first.")
    assert "Measure the KV transfer first." in client.get(url).content.decode()

    Change.objects.filter(pk=config_change.pk).update(
        risk=[finding | {"reason": "a reason the first read did not show"}
              for finding in config_change.risk])
    assert "a reason the first read did not show" in client.get(url).content.decode()

    client.force_login(viewer)
    page = client.get(url).content.decode()
    assert "Measure the KV transfer first." in page
    assert "Comment on this line" not in page  # a viewer's rows link nowhere


def test_a_comment_on_a_line_outside_the_diff_is_refused(config_change: Change,
                                                         reviewer: User) -> None:
    with pytest.raises(DomainError, match="line 99 is not a line of this diff"):
        change_comment(change=config_change, author=reviewer, path="config/serving.toml",
                       line=99, side="new", text="?")
    assert not ReviewComment.objects.exists()


def test_a_ten_megabyte_comment_gets_a_clear_page_and_changes_nothing(
    client: Client, reviewer: User, config_change: Change
) -> None:
    client.force_login(reviewer)

    response = client.post(f"/reviews/changes/{config_change.pk}/decide/",
                           {"decision": "approve", "comment": "x" * (10 << 20),
                            "diff_sha256": config_change.diff_sha256})

    assert response.status_code == 400
    assert "Nothing was changed" in response.content.decode()
    config_change.refresh_from_db()
    assert config_change.status == Change.Status.PENDING_REVIEW
    assert not ReviewDecision.objects.exists()


def test_a_long_comment_is_refused_with_a_message(client: Client, reviewer: User,
                                                  config_change: Change) -> None:
    client.force_login(reviewer)

    response = client.post(f"/reviews/changes/{config_change.pk}/decide/",
                           {"decision": "approve", "comment": "x" * 20_000,
                            "diff_sha256": config_change.diff_sha256}, follow=True)

    assert response.status_code == 200
    assert "at most 10000 characters" in response.content.decode()
    assert not ReviewDecision.objects.exists()


def test_a_stale_form_is_refused_with_the_reason(client: Client, reviewer: User,
                                                 config_change: Change) -> None:
    client.force_login(reviewer)

    response = client.post(f"/reviews/changes/{config_change.pk}/decide/",
                           {"decision": "approve", "diff_sha256": "a" * 64}, follow=True)

    assert "The diff changed since you opened it" in response.content.decode()
    config_change.refresh_from_db()
    assert config_change.status == Change.Status.PENDING_REVIEW


@pytest.mark.parametrize("path", ["decide", "merge", "comments"])
def test_a_get_on_a_post_only_url_is_refused(client: Client, reviewer: User,
                                             config_change: Change, path: str) -> None:
    client.force_login(reviewer)

    assert client.get(f"/reviews/changes/{config_change.pk}/{path}/").status_code == 405


def test_a_refused_comment_by_a_viewer_is_403_and_audited(client: Client, viewer: User,
                                                          config_change: Change) -> None:
    client.force_login(viewer)

    response = client.post(f"/reviews/changes/{config_change.pk}/comments/",
                           {"path": "config/serving.toml", "line": 2, "side": "new",
                            "text": "hello"})

    assert response.status_code == 403
    assert AuditEntry.objects.filter(action="change.comment_denied", actor=viewer).count() == 1
    assert not ReviewComment.objects.exists()


@pytest.mark.parametrize("text", ["not a diff at all", "\x00\x01binary"])
def test_a_diff_that_is_not_a_diff_is_refused_in_words(text: str, example_target: Target) -> None:
    with pytest.raises(DomainError, match="The change's diff cannot be read"):
        classify_diff(example_target, text)


def test_the_target_page_shows_each_goals_automatic_merge_setting(
    client: Client, viewer: User, example_goal: Goal
) -> None:
    client.force_login(viewer)

    page = client.get(f"/targets/{example_goal.target.name}/").content.decode()

    assert 'merge automatically: <strong class="auto-merge">off</strong>' in page
    assert "every change waits for a reviewer" in page


def _panel(page: str) -> str:
    return page[page.index('<section id="gate-checks"'):page.index("</section>")]


def test_review_required_is_neutral_not_failing_in_the_panel_and_the_queue(
    client: Client, reviewer: User, passing_submit: Callable[..., Change]
) -> None:
    # issue 27: "a reviewer decides" counted as failing, so every queued change looked broken
    change = passing_submit(files={"config/serving.toml": SERVING_TOML})
    client.force_login(reviewer)

    panel = _panel(client.get(f"/reviews/changes/{change.pk}/").content.decode())
    queue = client.get("/reviews/").content.decode()

    assert 'data-check="risk">\n      <span class="mark" aria-label="review">' in panel
    assert "<strong>Review required</strong>: the evidence passes" in panel
    assert "failing" not in panel.split("<ul")[0]
    assert change.failing_checks == []
    assert '<span class="badge review"' in queue and "review required" in queue
    assert "check failing" not in queue and "checks failing" not in queue


def test_a_merged_change_says_what_it_merged_as_by_whom_and_over_which_checks(
    client: Client, reviewer: User, config_change: Change
) -> None:
    review_decide(change=config_change, reviewer=reviewer, decision="approve")
    config_change.refresh_from_db()
    client.force_login(reviewer)

    panel = _panel(client.get(f"/reviews/changes/{config_change.pk}/").content.decode())

    assert config_change.status == Change.Status.MERGED
    text = " ".join(panel.split())
    assert (f"Merged as <code>{config_change.merged_commit[:10]}</code> by "
            f"{reviewer.get_username()}, at ") in text
    assert "over: Automatic merge allowed; No numerics, concurrency or production risk" in text
    assert "merges only when a reviewer approves it" not in panel
    assert "as they stood when it merged" in panel


def test_the_panel_of_an_open_change_says_the_base_moved_when_it_has(
    client: Client, reviewer: User, passing_submit: Callable[..., Change],
    example_target: Target, commit_on: CommitOn
) -> None:
    # issue 27: "Base unmoved" stayed ticked after main moved
    change = passing_submit(files={"config/serving.toml": SERVING_TOML})  # waits: risk
    assert change.status == Change.Status.PENDING_REVIEW
    move_main(example_target, commit_on, {"README.md": "Someone else's edit.\n"})
    client.force_login(reviewer)

    panel = _panel(client.get(f"/reviews/changes/{change.pk}/").content.decode())

    assert 'data-check="base">\n      <span class="mark" aria-label="failed">' in panel
    assert f"main moved from {change.base_commit[:10]}" in panel


def test_approving_over_a_failed_criterion_takes_a_named_second_step(
    client: Client, reviewer: User, passing_submit: Callable[..., Change],
    auto_goal: GoalVersion
) -> None:
    # issue 27: a change whose acceptance criterion failed merged with one click, no warning
    spec = auto_goal.spec["criteria"][0]
    change = passing_submit(findings=[criterion_finding(spec, passed=False),
                                      perf_finding("latency-bench", "latency_ms")])
    failed = [str(c["title"]) for c in change.failing_checks]
    assert failed and change.status == Change.Status.PENDING_REVIEW
    client.force_login(reviewer)
    url = f"/reviews/changes/{change.pk}/"
    page = client.get(url).content.decode()
    assert '<fieldset id="override"' in page and ">Approve and merge</button>" not in page
    form = {"decision": "approve", "comment": "", "diff_sha256": change.diff_sha256}

    first = client.post(f"{url}decide/", form, follow=True).content.decode()
    change.refresh_from_db()
    assert change.status == Change.Status.PENDING_REVIEW
    assert "Approving merges over failing evidence: give your reason" in first
    assert not change.decisions.exists()

    client.post(f"{url}decide/", form | {"override_reason": "the criterion's probe is flaky"})
    change.refresh_from_db()

    assert change.status == Change.Status.MERGED
    decision = change.decisions.get()
    assert (decision.overridden_checks, decision.override_reason) == (
        failed, "the criterion's probe is flaky")
    audit = AuditEntry.objects.get(action="change.approve", object_id=str(change.pk))
    assert audit.data["override"] == {"checks": failed,
                                      "reason": "the criterion's probe is flaky"}
    merged = client.get(url).content.decode()
    assert '<span id="merged-over" class="badge bad">merged over failing checks</span>' in merged


def test_a_cheats_speed_up_is_no_gain_confirmed_on_the_change_page(
    client: Client, viewer: User, passing_submit: Callable[..., Change], auto_goal: GoalVersion,
) -> None:
    """Issue 26: a candidate that stopped doing the work (1000x faster, an implausible
    speed-up) had its gain ticked "✔ Gain confirmed end to end … ratio 0.001"."""
    faster = perf_finding("latency-bench", "latency_ms", detail="ratio 0.001")
    cheat = {"layer": "integrity", "kind": "too-good-to-be-true", "severity": "fail",
             "title": "latency-bench latency_ms 1000x better: implausible", "detail": "d",
             "specificity": 20, "evidence": {"probe": "latency-bench"}}
    change = passing_submit(findings=[criterion_finding(auto_goal.spec["criteria"][0]), faster,
                                      cheat])
    client.force_login(viewer)

    panel = _panel(client.get(f"/reviews/changes/{change.pk}/").content.decode())

    marks = dict(re.findall(r'data-check="([^"]+)">\s*<span class="mark" aria-label="(\w+)"',
                            panel))
    assert (marks["end-to-end"], marks["integrity"]) == ("failed", "failed"), marks
    assert re.search(r"no gain is credited: latency-bench latency_ms \w+ comes with an "
                     r"integrity failure", panel), panel
    assert "✔</span>\n      <strong>Gain confirmed" not in panel


def test_the_change_page_reads_its_decisions_once_and_finds_the_approval_among_them(
    client: Client, reviewer: User, viewer: User, config_change: Change
) -> None:
    seen = {"diff_sha256": config_change.diff_sha256, "base_commit": config_change.base_commit}
    ReviewDecision.objects.create(change=config_change, reviewer=reviewer,
                                  decision=ReviewDecision.Decision.REQUEST_CHANGES, **seen)
    ReviewDecision.objects.create(change=config_change, reviewer=reviewer,
                                  decision=ReviewDecision.Decision.APPROVE,
                                  overridden_checks=["risk"], override_reason="known", **seen)
    Change.objects.filter(pk=config_change.pk).update(status=Change.Status.MERGED)
    client.force_login(viewer)

    with CaptureQueriesContext(connection) as queries:
        page = client.get(f"/reviews/changes/{config_change.pk}/").content.decode()

    decision_reads = [q["sql"] for q in queries.captured_queries
                      if 'FROM "reviews_reviewdecision"' in q["sql"]]
    assert len(decision_reads) == 1, decision_reads  # the list and the approval: one read
    assert 'id="merged-over"' in page  # the latest decision, an approval over failing checks
    decisions = page[page.index('id="decisions-title"'):]
    assert decisions.index("request changes") < decisions.index("Approve")
