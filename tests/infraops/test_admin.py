"""The admin editor through the test client, as an engineer (staff, with the role's rights)."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.contrib.auth.models import User
from django.test import Client

from infraops import tasks
from infraops.models import AcceptanceCriterion, Boundary, Goal, GoalVersion, Target
from infraops.services.goals import goal_snapshot
from tests.conftest import make_origin


class FormFields(HTMLParser):
    """What a browser would submit from the page's forms with their current values (the
    admin's empty inline templates, '__prefix__', left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: dict[str, str] = {}
        self._textarea: str | None = None
        self._select: str | None = None
        self._first_option: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        name = a.get("name", "")
        if tag == "input" and name and "__prefix__" not in name:
            kind = a.get("type", "text")
            if kind in ("submit", "button", "image", "file"):
                return
            if kind in ("checkbox", "radio") and "checked" not in a:
                return
            self.fields[name] = a.get("value", "on" if kind == "checkbox" else "")
        elif tag == "textarea" and "__prefix__" not in name:
            self._textarea = name
            self.fields[name] = ""
        elif tag == "select" and "__prefix__" not in name:
            self._select, self._first_option = name, None
        elif tag == "option" and self._select:
            if self._first_option is None:
                self._first_option = a.get("value", "")
                self.fields.setdefault(self._select, self._first_option)
            if "selected" in a:
                self.fields[self._select] = a.get("value", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "textarea" and self._textarea:
            # HTML drops one newline right after <textarea>; Django writes one there.
            self.fields[self._textarea] = self.fields[self._textarea].removeprefix("\n")
            self._textarea = None
        elif tag == "select":
            self._select = None

    def handle_data(self, data: str) -> None:
        if self._textarea:
            self.fields[self._textarea] += data


def form_of(client: Client, url: str) -> dict[str, str]:
    response = client.get(url)
    assert response.status_code == 200
    parser = FormFields()
    parser.feed(response.content.decode())
    parser.fields.pop("csrfmiddlewaretoken", None)
    return parser.fields


@pytest.fixture
def editor(client: Client, engineer: User) -> Client:
    client.force_login(engineer)
    return client


def new_goal(client: Client, target: Target, **changes: str) -> dict[str, str]:
    """The add-goal form filled in with a valid goal, then `changes` applied."""
    fields = form_of(client, "/admin/infraops/goal/add/")
    assert fields["boundary-TOTAL_FORMS"] == "1"
    assert fields["criteria-TOTAL_FORMS"] == "0"
    fields.update({
        "target": str(target.pk), "name": "throughput", "probe": "latency-bench",
        "metric": "latency_ms", "direction": "minimize", "relative_target": "0.1",
        "boundary-0-editable_paths": "config/**",
    })
    fields.update(changes)
    return fields


def with_criterion(fields: dict[str, str], **criterion: str) -> dict[str, str]:
    values = {"kind": "relative", "probe": "latency-bench", "metric": "latency_ms",
              "variant": "", "reference_variant": "", "comparison": "<=", "value": "-0.05",
              **criterion}
    return fields | {"criteria-TOTAL_FORMS": "1"} | {
        f"criteria-0-{name}": value for name, value in values.items()
    }


def test_adding_a_valid_goal_records_version_one(editor: Client,
                                                 example_target: Target) -> None:
    fields = with_criterion(new_goal(editor, example_target))

    response = editor.post("/admin/infraops/goal/add/", fields, follow=True)

    assert response.status_code == 200
    assert "Goal saved as version 1" in response.content.decode()
    goal = Goal.objects.get(name="throughput")
    assert goal.current_version == 1
    version = GoalVersion.objects.get(goal=goal)
    assert version.number == 1
    assert version.spec["boundary"]["editable_paths"] == ["config/**"]
    assert [(c["kind"], c["value"]) for c in version.spec["criteria"]] == [("relative", -0.05)]


@pytest.mark.parametrize(("changes", "message"), [
    ({"probe": "no-such-bench"}, "The manifest has no probe &#x27;no-such-bench&#x27;"),
    ({"metric": "tokens_per_s"},
     "Probe &#x27;latency-bench&#x27; reports no metric &#x27;tokens_per_s&#x27;"),
    ({"relative_target": "0"}, "A wanted improvement is a positive fraction."),
])
def test_a_goal_naming_what_the_manifest_lacks_is_refused(
    editor: Client, example_target: Target, changes: dict[str, str], message: str
) -> None:
    response = editor.post("/admin/infraops/goal/add/", new_goal(editor, example_target,
                                                                 **changes))

    assert response.status_code == 200
    assert message in response.content.decode()
    assert not Goal.objects.exists()
    assert not GoalVersion.objects.exists()


@pytest.mark.parametrize(("criterion", "message"), [
    ({"probe": "accuracy"}, "has no probe &#x27;accuracy&#x27;"),
    ({"metric": "p99_ms"}, "reports no metric &#x27;p99_ms&#x27;"),
])
def test_a_criterion_naming_what_the_manifest_lacks_is_refused(
    editor: Client, example_target: Target, criterion: dict[str, str], message: str
) -> None:
    fields = with_criterion(new_goal(editor, example_target), **criterion)

    response = editor.post("/admin/infraops/goal/add/", fields)

    assert response.status_code == 200
    assert message in response.content.decode()
    assert not Goal.objects.exists()
    assert not AcceptanceCriterion.objects.exists()


@pytest.mark.parametrize(("field", "value", "message"), [
    ("editable_paths", "/abs/**", "must be relative to the repository root"),
    ("editable_paths", "config/**\na/../b", "must not contain &#x27;..&#x27;"),
    ("protected_paths", "bench/[x", "has an unbalanced [ ]"),
    ("forbidden_patterns", "os\\.system(", "is not a valid regular expression"),
])
def test_a_boundary_with_an_invalid_glob_or_regex_is_refused(
    editor: Client, example_target: Target, field: str, value: str, message: str
) -> None:
    fields = new_goal(editor, example_target, **{f"boundary-0-{field}": value})

    response = editor.post("/admin/infraops/goal/add/", fields)

    assert response.status_code == 200
    assert message in response.content.decode()
    assert not Goal.objects.exists()
    assert not Boundary.objects.exists()


def test_a_saved_edit_is_a_new_version_and_an_unchanged_save_is_not(
    editor: Client, example_goal: Goal
) -> None:
    url = f"/admin/infraops/goal/{example_goal.pk}/change/"
    fields = form_of(editor, url)
    assert fields["relative_target"] == "0.1"
    assert fields["boundary-0-editable_paths"] == "config/**"

    first = editor.post(url, fields | {"relative_target": "0.2"}, follow=True)

    assert "Goal saved as version 2" in first.content.decode()
    assert list(example_goal.versions.values_list("number", flat=True)) == [2, 1]
    assert example_goal.versions.get(number=2).spec["relative_target"] == 0.2
    assert example_goal.versions.get(number=1).spec["relative_target"] == 0.1

    again = editor.post(url, form_of(editor, url), follow=True)

    assert again.status_code == 200
    assert "Goal saved as version 2" in again.content.decode()
    assert example_goal.versions.count() == 2
    example_goal.refresh_from_db()
    assert example_goal.current_version == 2


def test_an_edit_of_the_boundary_alone_is_a_new_version(editor: Client,
                                                        example_goal: Goal) -> None:
    url = f"/admin/infraops/goal/{example_goal.pk}/change/"
    fields = form_of(editor, url) | {"boundary-0-max_experiments": "3"}

    editor.post(url, fields)

    latest = example_goal.versions.get(number=2)
    assert latest.spec["boundary"]["max_experiments"] == 3


def added_and_fetched(editor: Client, capture: Any, **fields: str) -> Target:
    """Add a target through the form, then run the fetch its save handed over, as the
    worker would (the request itself runs no git: test_a_target_form_runs_no_git...)."""
    with capture(execute=False) as sent:
        response = editor.post("/admin/infraops/target/add/",
                               form_of(editor, "/admin/infraops/target/add/") | fields)
    assert response.status_code == 302, response.content.decode()[:2000]
    target = Target.objects.get(name=fields["name"])
    assert target.fetch_status == Target.Fetch.FETCHING
    assert len(sent) == 1
    with patch("infraops.services.targets.queue_fetch", tasks.target_fetch):
        sent[0]()
    target.refresh_from_db()
    return target


def test_adding_a_target_with_an_unreachable_repository_says_its_fetch_failed(
    editor: Client, tmp_path: Path, django_capture_on_commit_callbacks: Any,
) -> None:
    target = added_and_fetched(editor, django_capture_on_commit_callbacks, name="ghost",
                               repo_url=str(tmp_path / "missing.git"), base_branch="main")

    assert target.fetch_status == Target.Fetch.FAILED
    assert "cannot be read" in target.fetch_error
    page = html.unescape(editor.get("/targets/ghost/").content.decode())
    assert "Fetching the repository failed" in page and "cannot be read" in page


def test_adding_a_target_without_its_branch_says_its_fetch_failed(
    editor: Client, tmp_path: Path, django_capture_on_commit_callbacks: Any,
) -> None:
    target = added_and_fetched(editor, django_capture_on_commit_callbacks, name="tiny",
                               repo_url=str(make_origin(tmp_path)), base_branch="release")

    assert target.fetch_status == Target.Fetch.FAILED
    assert target.fetch_error == (f"The repository {target.repo_url!r} has no branch "
                                  "'release'.")
    assert not target.clone_path.exists()


def test_a_target_form_runs_no_git_in_its_request(
    editor: Client, tmp_path: Path, django_capture_on_commit_callbacks: Any,
) -> None:
    """Issue 28: URLs that hang held a web thread for 60 s or more (eight filled the pool).
    The request saves the target as being fetched and hands the git work to a worker."""
    fields = form_of(editor, "/admin/infraops/target/add/") | {
        "name": "tiny", "repo_url": str(make_origin(tmp_path)), "base_branch": "main"}

    def no_git(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("git ran in the web request")

    with patch("infraops.gitops._communicate", no_git), \
            django_capture_on_commit_callbacks(execute=False) as sent:
        response = editor.post("/admin/infraops/target/add/", fields)
        page = editor.get("/targets/tiny/").content.decode()

    assert response.status_code == 302
    assert [callback.__qualname__ for callback in sent] == [
        "target_fetch_request.<locals>.<lambda>"]
    assert "The repository is being fetched by a worker" in page


def test_a_fetch_past_its_deadline_fails_with_the_reason(example_target: Target) -> None:
    def slow(**kwargs: Any) -> None:
        raise SoftTimeLimitExceeded()

    with patch("infraops.services.targets.target_fetch", slow):
        tasks.target_fetch(example_target.pk, False, False)

    example_target.refresh_from_db()
    assert example_target.fetch_status == Target.Fetch.FAILED
    assert example_target.fetch_error.startswith(
        f"fetching the repository took longer than {tasks.TARGET_FETCH_SECONDS} s")


def test_a_fetch_the_task_queue_refuses_fails_with_the_reason(
    editor: Client, example_target: Target, django_capture_on_commit_callbacks: Any,
) -> None:
    def down(*args: Any, **kwargs: Any) -> None:
        raise ConnectionRefusedError("redis")

    with patch("infraops.services.targets.queue_fetch", down), \
            django_capture_on_commit_callbacks(execute=True):
        editor.post("/admin/infraops/target/", {
            "action": "refresh_manifest", "_selected_action": [str(example_target.pk)]})

    example_target.refresh_from_db()
    assert example_target.fetch_status == Target.Fetch.FAILED
    assert "the task queue (Redis) was not answering" in example_target.fetch_error


def test_a_target_cannot_name_another_targets_copy_in_the_data_folder(
    editor: Client, example_target: Target
) -> None:
    """Issue 28: an engineer of target A read target B's files by naming the service's own
    bare copy of B (or the service's checkout) as a new target's URL."""
    from django.conf import settings

    for url in (str(example_target.clone_path), f"file://{example_target.clone_path}",
                str(settings.BASE_DIR)):
        fields = form_of(editor, "/admin/infraops/target/add/") | {
            "name": "copy-of-b", "repo_url": url, "base_branch": "main",
        }

        response = editor.post("/admin/infraops/target/add/", fields)

        assert response.status_code == 200
        assert "data folder or checkout" in response.content.decode()
    assert not Target.objects.filter(name="copy-of-b").exists()


@pytest.mark.parametrize(("url", "words"), [
    ("https://169.254.169.254/latest/meta-data", "link-local"),
    ("fd::17", "remote helper"),
    ("git://127.0.0.1:9418/x", "git:// URLs are not allowed"),
    ("ext::sh -c id", "remote helper"),
], ids=["link-local", "fd", "git-loopback", "ext"])
def test_urls_the_server_must_not_reach_are_refused_before_git_runs(
    editor: Client, url: str, words: str
) -> None:
    fields = form_of(editor, "/admin/infraops/target/add/") | {
        "name": "probe", "repo_url": url, "base_branch": "main",
    }

    response = editor.post("/admin/infraops/target/add/", fields)

    assert response.status_code == 200
    assert words in html.unescape(response.content.decode())
    assert not Target.objects.exists()


def test_adding_a_reachable_target_clones_it_and_reads_its_manifest(
    editor: Client, tmp_path: Path, engineer: User, django_capture_on_commit_callbacks: Any,
) -> None:
    target = added_and_fetched(editor, django_capture_on_commit_callbacks, name="tiny",
                               repo_url=str(make_origin(tmp_path)), base_branch="main")

    assert target.fetch_status == Target.Fetch.READY and target.fetch_error == ""
    assert target.created_by == engineer
    assert target.clone_path.is_dir()
    assert target.manifest_errors == []
    assert target.manifest() is not None


# --- the editor as users come for it: manifest values offered, absurd goals refused, the goal
# said in a sentence, the site named as the product.

def test_the_goal_form_offers_the_manifests_probes_and_metrics(
        editor: Client, example_target: Target) -> None:
    page = editor.get("/admin/infraops/goal/add/").content.decode()
    probe = re.search(r'<select name="probe"[^>]*>(.*?)</select>', page, re.S)
    metric = re.search(r'<select name="metric"[^>]*>(.*?)</select>', page, re.S)
    assert probe and metric, "probe and metric are selects, not free text"
    assert f'<optgroup label="{example_target.name}">' in probe.group(1)
    assert '<option value="latency-bench">latency-bench</option>' in probe.group(1)
    assert f'<optgroup label="{example_target.name} / latency-bench">' in metric.group(1)
    assert '<option value="latency_ms">latency_ms</option>' in metric.group(1)
    assert '<select name="criteria-__prefix__-probe"' in page  # the criteria's too


@pytest.mark.parametrize(("direction", "wanted", "message"), [
    ("minimize", "50", "5000% lower is impossible"),
    ("minimize", "1", "100% lower is impossible"),
    ("maximize", "50", "5000% higher is not a goal a run can reach"),
])
def test_an_absurd_wanted_improvement_is_refused(
        editor: Client, example_target: Target, direction: str, wanted: str,
        message: str) -> None:
    response = editor.post("/admin/infraops/goal/add/", new_goal(
        editor, example_target, direction=direction, relative_target=wanted))
    assert response.status_code == 200 and message in response.content.decode()
    assert not Goal.objects.exists()


def test_zero_experiments_is_refused(editor: Client, example_target: Target) -> None:
    response = editor.post("/admin/infraops/goal/add/", new_goal(
        editor, example_target, **{"boundary-0-max_experiments": "0"}))
    assert response.status_code == 200 and not Goal.objects.exists()
    assert "errorlist" in response.content.decode()


def test_a_saved_goal_says_in_a_sentence_what_it_asks(editor: Client,
                                                      example_goal: Goal) -> None:
    page = html.unescape(editor.get(
        f"/admin/infraops/goal/{example_goal.pk}/change/").content.decode())
    assert ("lower latency-bench.latency_ms by at least 10% against the base, with 95% "
            "confidence, within 8 experiments") in page


def test_the_editor_is_named_as_the_product_and_leads_back_to_the_dashboard(
        editor: Client) -> None:
    page = editor.get("/admin/").content.decode()
    assert "InfraOps · admin editor" in page
    assert '<a href="/">View site</a>' in page


def test_a_goal_version_says_what_it_changed_before_its_raw_spec(
        editor: Client, example_goal: Goal, engineer: User) -> None:
    example_goal.boundary.max_experiments = 12
    example_goal.boundary.save()
    version = goal_snapshot(goal=example_goal, user=engineer)

    page = html.unescape(editor.get(
        f"/admin/infraops/goalversion/{version.pk}/change/").content.decode())

    assert "What it changed" in page and "boundary.max_experiments: 8 → 12" in page
    assert page.index("boundary.max_experiments: 8 → 12") < page.index('"max_experiments"')


# --- variant cells offered from the manifest, as variant_key spells them; absurd criterion
# bounds refused in words (absurd budgets: test_access_hardening.py).

VARIANTS = 'variants = {dtype = ["fp16", "fp32"], batch = ["1", "8"]}\n'
SMOKE = ('\n[[probe]]\nname = "smoke"\nlayer = "behaviour"\ncommand = "true"\n'
         'metrics = ["errors"]\n')


@pytest.fixture
def variant_target(example_target: Target) -> Target:
    """tiny-serving whose latency-bench runs a 2 x 2 matrix, beside a probe with no variants."""
    text = example_target.manifest_text.replace('metrics = ["latency_ms"]\n',
                                                'metrics = ["latency_ms"]\n' + VARIANTS, 1)
    example_target.manifest_text = text + SMOKE
    example_target.save()
    assert example_target.manifest() is not None
    return example_target


def select_of(page: str, name: str) -> str:
    found = re.search(rf'<select name="{re.escape(name)}"[^>]*>(.*?)</select>', page, re.S)
    assert found, f"{name} is a select, not free text"
    return found.group(1)


def test_the_variant_fields_offer_the_probes_cells_canonically(
        editor: Client, variant_target: Target) -> None:
    page = editor.get("/admin/infraops/goal/add/").content.decode()

    for name in ("criteria-__prefix__-variant", "criteria-__prefix__-reference_variant"):
        options = select_of(page, name)
        assert f'<optgroup label="{variant_target.name} / latency-bench">' in options
        cells = re.findall(r'<option value="([^"]*)"', options)
        # keys sorted as variant_key writes them, values in manifest order; no smoke cells
        assert cells[1:] == ["batch=1,dtype=fp16", "batch=8,dtype=fp16", "batch=1,dtype=fp32",
                             "batch=8,dtype=fp32"]
        assert "/ smoke" not in options
    assert '<option value="" selected>every cell</option>' in select_of(
        page, "criteria-__prefix__-variant")
    assert "A cell of the criterion&#x27;s probe&#x27;s variant matrix" in page


def test_a_criterion_on_a_cell_is_saved_as_its_canonical_text(
        editor: Client, variant_target: Target) -> None:
    fields = with_criterion(new_goal(editor, variant_target), kind="relation",
                            variant="dtype=fp16, batch=8", reference_variant="batch=1,dtype=fp16")

    response = editor.post("/admin/infraops/goal/add/", fields, follow=True)

    assert "Goal saved as version 1" in response.content.decode()
    criterion = AcceptanceCriterion.objects.get()
    assert (criterion.variant, criterion.reference_variant) == ("batch=8,dtype=fp16",
                                                                "batch=1,dtype=fp16")


@pytest.mark.parametrize(("criterion", "message"), [
    ({"variant": "batch=2,dtype=fp16"},
     "Probe &#x27;latency-bench&#x27; has no variant cell &#x27;batch=2,dtype=fp16&#x27; "
     "(its cells: batch=1,dtype=fp16, batch=8,dtype=fp16, batch=1,dtype=fp32, "
     "batch=8,dtype=fp32)."),
    ({"variant": "batch=8"}, "has no variant cell &#x27;batch=8&#x27;"),
    ({"probe": "smoke", "metric": "errors", "variant": "batch=8,dtype=fp16"},
     "Probe &#x27;smoke&#x27; declares no variants: leave this blank"),
    ({"kind": "relation", "variant": "batch=8,dtype=fp16",
      "reference_variant": "batch=8,dtype=fp16"},
     "A relation compares two different cells"),
    ({"variant": "batch"}, "&#x27;batch&#x27; is not key=value"),
])
def test_a_criterion_on_a_cell_the_probe_lacks_is_refused(
        editor: Client, variant_target: Target, criterion: dict[str, str],
        message: str) -> None:
    fields = with_criterion(new_goal(editor, variant_target), **criterion)

    response = editor.post("/admin/infraops/goal/add/", fields)

    assert response.status_code == 200
    assert message in response.content.decode()
    assert not Goal.objects.exists()


def test_a_stored_cell_the_manifest_dropped_is_shown_kept_and_named(
        editor: Client, example_goal: Goal) -> None:
    """Editing an old goal never loses a value silently: no select would hold it, and the
    browser would post its first choice instead."""
    example_goal.criteria.update(variant="cp=on")
    url = f"/admin/infraops/goal/{example_goal.pk}/change/"
    page = editor.get(url).content.decode()

    assert ('<option value="cp=on" selected>cp=on (not in the manifest)</option>'
            in select_of(page, "criteria-0-variant"))

    response = editor.post(url, form_of(editor, url))

    assert response.status_code == 200
    assert ("Probe &#x27;latency-bench&#x27; declares no variants: leave this blank"
            in response.content.decode())
    assert example_goal.criteria.get().variant == "cp=on"
    assert example_goal.versions.count() == 1


def test_a_cell_written_by_hand_selects_its_choice_and_saves_unchanged(
        editor: Client, example_goal: Goal, variant_target: Target) -> None:
    example_goal.criteria.update(variant="dtype=fp32 , batch=1")
    goal_snapshot(goal=example_goal)
    url = f"/admin/infraops/goal/{example_goal.pk}/change/"
    options = select_of(editor.get(url).content.decode(), "criteria-0-variant")

    assert '<option value="batch=1,dtype=fp32" selected>batch=1,dtype=fp32</option>' in options
    assert "not in the manifest" not in options

    response = editor.post(url, form_of(editor, url), follow=True)

    assert "Goal saved as version 2" in response.content.decode()
    assert example_goal.versions.count() == 2


@pytest.mark.parametrize(("criterion", "message"), [
    ({"value": "-5"}, "-500% is no bound: a metric falls by less than 100%"),
    ({"value": "-1", "comparison": ">="}, "-100% is no bound"),
    ({"kind": "relation", "value": "-2", "variant": "", "reference_variant": ""},
     "-200% is no bound"),
    ({"value": "50"}, "+5000% against the baseline is not a change a run can show; at most "
                      "+1000%"),
    ({"value": "nan"}, "Enter a number."),
])
def test_an_absurd_criterion_bound_is_refused(
        editor: Client, example_target: Target, criterion: dict[str, str],
        message: str) -> None:
    fields = with_criterion(new_goal(editor, example_target), **criterion)

    response = editor.post("/admin/infraops/goal/add/", fields)

    assert response.status_code == 200
    assert message in response.content.decode()
    assert not Goal.objects.exists()


def test_a_threshold_on_a_metric_keeps_any_bound(editor: Client,
                                                 example_target: Target) -> None:
    fields = with_criterion(new_goal(editor, example_target), kind="threshold", value="5000")

    response = editor.post("/admin/infraops/goal/add/", fields, follow=True)

    assert "Goal saved as version 1" in response.content.decode()
