"""manage.py adduser, load_example and prepare: a new installation's first users see its
first target; the FLA examples are built from the installed release, and loaded only where
they can run.

With per-target access (infraops.access) a user who is no member of a target sees nothing of
it, so the commands that make the first users and the example target make them members."""

from __future__ import annotations

import os
import shutil
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from agents.models import AgentRun
from infraops import gitops
from infraops.access import target_role, visible_targets
from infraops.knobs import knob_read
from infraops.management.commands import load_example
from infraops.models import Target

pytestmark = pytest.mark.django_db

EXAMPLES = Path(settings.BASE_DIR) / "examples"
TF32 = b"CP_DOT_PRECISION = tl.constexpr('ieee' if IS_NPU else 'tf32')"


def test_load_example_makes_the_existing_role_holders_members_in_their_first_role() -> None:
    call_command("adduser", "admin", "--role", "engineer", "--admin", "--password", "p")
    call_command("adduser", "rae", "--role", "reviewer", "--password", "p")
    call_command("adduser", "both", "--role", "viewer", "--role", "engineer", "--password", "p")
    User.objects.create_user("nobody-with-no-role")

    call_command("load_example")

    example = Target.objects.get(name="tiny-serving")
    assert target_role(User.objects.get(username="rae"), example) == "reviewer"
    assert target_role(User.objects.get(username="both"), example) == "engineer"
    assert not visible_targets(User.objects.get(username="nobody-with-no-role")).exists()
    assert sorted(example.memberships.values_list("user__username", flat=True)) == [
        "both", "rae"]  # the superuser sees every target without one
    call_command("load_example")  # idempotent
    assert example.memberships.count() == 2


def test_adduser_target_makes_the_user_a_member_and_an_unknown_target_changes_nothing(
    example_target: Target,
) -> None:
    call_command("adduser", "vic", "--role", "viewer", "--target", example_target.name,
                 "--password", "p")
    assert target_role(User.objects.get(username="vic"), example_target) == "viewer"

    with pytest.raises(CommandError, match="No target named 'nope': nothing was changed"):
        call_command("adduser", "newcomer", "--role", "viewer", "--target", "nope")
    assert not User.objects.filter(username="newcomer").exists()


@pytest.fixture
def examples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of examples/ that load_example reads instead: the FLA examples copied, for a test
    to change, the others linked."""
    folder = tmp_path / "examples"
    folder.mkdir()
    for entry in EXAMPLES.iterdir():
        if entry.name in ("fla-kda", "fla-cp"):
            shutil.copytree(entry, folder / entry.name,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (folder / entry.name).symlink_to(entry)
    monkeypatch.setattr(load_example, "EXAMPLES", folder)
    return folder


def test_load_example_fla_cp_commits_the_installed_release_with_the_tf32_merge(
    examples: Path, data_dir: Path,
) -> None:
    call_command("load_example", "fla-cp", stdout=StringIO())

    # The manifest's knob reads the precision the edit set, in the tree the build made.
    manifest = Target.objects.get(name="fla-cp").manifest()
    assert manifest is not None
    knob = next(k for k in manifest.knobs if k.name == "cp_dot_precision")
    origin = data_dir / "examples" / "fla-cp.git"
    merge = gitops.read_file(origin, "main", "fla/ops/cp/chunk_merge.py")
    assert merge is not None and merge.count(TF32) == 1
    assert knob_read(knob, merge.decode()) == "tf32"
    files = set(gitops.list_files(origin, "main"))
    assert {"fla/ops/kda/fused_recurrent.py", "LICENSES/fla-core/LICENSE", "infraops.toml"} <= files
    assert "source.toml" not in files
    message = gitops.git(origin, "log", "-1", "--format=%B", "main")
    assert message.startswith("fla-cp: the bundled example, built from fla-core 0.6.0 (fla)")


def test_load_example_refuses_a_malformed_source_toml_and_makes_no_repository(
    examples: Path, data_dir: Path,
) -> None:
    (examples / "fla-cp" / "source.toml").write_text('[[distribution]]\nname = "fla-core"\n')

    refused = (r"^Example fla-cp: source\.toml: line 1, distribution\[1\], field version: "
               r"version is required")
    with pytest.raises(CommandError, match=refused):
        call_command("load_example", "fla-cp", stdout=StringIO())
    assert not (data_dir / "examples" / "fla-cp.git").exists()
    assert not Target.objects.filter(name="fla-cp").exists()


def prepare(settings: Any, tmp_path: Path, *args: str) -> str:
    settings.STATIC_ROOT = tmp_path / "static"
    out = StringIO()
    call_command("prepare", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_prepare_without_a_gpu_worker_says_why_it_loads_no_fla_example(
    settings: Any, tmp_path: Path,
) -> None:
    settings.GPU_WORKER = False
    said = prepare(settings, tmp_path, "--no-showcase")
    assert "Not loading fla-kda and fla-cp: no GPU worker here to run their probes" in said
    assert set(Target.objects.values_list("name", flat=True)) == {"tiny-serving", "demo-kernels"}


def test_prepare_with_a_gpu_worker_but_another_release_says_what_to_install(
    settings: Any, tmp_path: Path, examples: Path,
) -> None:
    settings.GPU_WORKER = True
    source = examples / "fla-kda" / "source.toml"
    source.write_text(source.read_text().replace('version = "0.6.0"', 'version = "0.7.0"'))
    said = prepare(settings, tmp_path, "--no-showcase")
    assert ("Not loading fla-kda and fla-cp: fla-core 0.6.0 is installed, but the example is "
            "built from 0.7.0: run `pip install --require-hashes --no-deps -r "
            "requirements-gpu.txt`.") in said
    assert not Target.objects.filter(name__startswith="fla-").exists()


def test_prepare_with_a_gpu_worker_loads_the_fla_examples_and_starts_only_the_named_showcase(
    settings: Any, tmp_path: Path, examples: Path,
) -> None:
    settings.GPU_WORKER = True
    (examples / "fla-cp.goals.toml").unlink()  # a target without goals gets a line, no error
    said = prepare(settings, tmp_path, "--showcase-only", "fla-kda", "--showcase-only", "fla-cp")
    assert {"fla-kda", "fla-cp"} <= set(Target.objects.values_list("name", flat=True))
    assert "No showcase on fla-cp: it has no goals (examples/fla-cp.goals.toml)." in said
    started = AgentRun.objects.values_list("goal_version__goal__target__name", flat=True)
    assert set(started) == {"fla-kda"}  # demo-kernels' showcase was left out


@pytest.mark.parametrize("args", [
    ["--showcase-only", "tiny-serving"],
    ["--no-showcase", "--showcase-only", "fla-kda"],
], ids=["not-a-showcase-target", "with-no-showcase"])
@pytest.mark.parametrize("command", ["prepare", "standalone"])
def test_a_showcase_only_that_cannot_be_honoured_is_refused_before_anything_starts(
    command: str, args: list[str],
) -> None:
    with pytest.raises(CommandError, match="argument --showcase-only"):
        call_command(command, *args)


def test_the_llm_demo_goal_is_measured_by_the_merges_error_not_its_wall_time() -> None:
    from infraops.models import Goal

    call_command("load_example", "demo-kernels", stdout=StringIO())

    goal = Goal.objects.get(name__startswith="Numerics, by the LLM agent")
    assert (goal.probe, goal.metric, goal.direction) == ("cp-error", "max_rel_error", "minimize")
    probe = goal.target.manifest().probe(goal.probe)  # type: ignore[union-attr]
    assert probe is not None and probe.metric(goal.metric).kind == "error"


def test_a_second_prepare_says_only_what_is_new(settings: Any, tmp_path: Path) -> None:
    """Every start repeated the first start's lines: each example 'ready' with its goals, why
    the FLA examples and the LLM and GPU goals were left out, the showcase's step."""
    settings.GPU_WORKER = False
    settings.OPENAI_BASE_URL = ""
    first = prepare(settings, tmp_path)
    assert "Not loading fla-kda and fla-cp" in first and "Started run" in first
    assert "Not starting 'Numerics, by the LLM agent" in first

    again = prepare(settings, tmp_path)

    assert again.splitlines() == ["Migrating the database…",
                                  again.splitlines()[1]]  # "…: done in N s", and nothing else
    assert again.splitlines()[1].startswith("Migrating the database: done in ")


def test_a_later_prepare_starts_and_says_what_it_could_not_before(
        settings: Any, tmp_path: Path) -> None:
    """An LLM endpoint given on a later start (standalone --demo-llm) starts the LLM goal's
    showcase run, and says so."""
    settings.GPU_WORKER = False
    settings.OPENAI_BASE_URL = ""
    prepare(settings, tmp_path)
    settings.OPENAI_BASE_URL, settings.INFRAOPS_MODEL = "http://127.0.0.1:9/v1", "demo"

    again = prepare(settings, tmp_path)

    assert "Started run" in again and "'Numerics, by the LLM agent" in again
    assert "Not starting" not in again and "ready, goals" not in again


def own_static(settings: Any, tmp_path: Path) -> Path:
    """A static folder of the test's own, collected with the project's: its page.css."""
    static = tmp_path / "own-static"
    static.mkdir()
    source = static / "page.css"
    source.write_text("body { color: red; }\n")
    settings.STATICFILES_DIRS = [static]
    return source


def test_static_files_are_collected_again_only_when_they_changed(
        settings: Any, tmp_path: Path) -> None:
    """A warm start collected (hashed and gzipped) every static file again: seconds of it."""
    source = own_static(settings, tmp_path)

    first = prepare(settings, tmp_path, "--no-example")
    unchanged = prepare(settings, tmp_path, "--no-example")
    source.write_text("body { color: blue; }\n")
    changed = prepare(settings, tmp_path, "--no-example")

    assert "Collecting static files: done" in first
    assert "Collecting static files" not in unchanged
    assert "Collecting static files: done" in changed
    assert "color: blue" in (tmp_path / "static" / "page.css").read_text()


def test_a_static_file_edited_within_the_second_of_its_collection_is_collected_again(
        settings: Any, tmp_path: Path) -> None:
    """collectstatic keeps a copy at least as new as its source to the second: an edit in the
    second of the last collection (the test above, on a fast machine) was never collected."""
    source = own_static(settings, tmp_path)
    prepare(settings, tmp_path, "--no-example")
    collected = tmp_path / "static" / "page.css"

    source.write_text("body { color: blue; }\n")
    copied_at = collected.stat().st_mtime_ns
    os.utime(source, ns=(copied_at, copied_at))  # the edit, in the copy's own instant
    again = prepare(settings, tmp_path, "--no-example")

    assert "Collecting static files: done" in again
    assert "color: blue" in collected.read_text()


def test_a_stamp_of_an_earlier_release_collects_once_and_then_not_again(
        settings: Any, tmp_path: Path) -> None:
    own_static(settings, tmp_path)
    prepare(settings, tmp_path, "--no-example")
    (tmp_path / "static" / ".infraops-collected").write_text("0" * 64)  # a bare hash

    assert "Collecting static files: done" in prepare(settings, tmp_path, "--no-example")
    assert "Collecting static files" not in prepare(settings, tmp_path, "--no-example")
