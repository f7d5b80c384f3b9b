"""Fixtures on real PostgreSQL, Redis and git: users with roles, the example target."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import factory
import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User

from infraops import gitops
from infraops.models import AcceptanceCriterion, Boundary, Goal, Target
from infraops.services.goals import goal_snapshot
from infraops.services.targets import target_register

EXAMPLE = Path(settings.BASE_DIR) / "examples" / "tiny-serving"


class UserFactory(factory.django.DjangoModelFactory[User]):
    class Meta:
        model = User
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.PostGenerationMethodCall("set_password", "correct horse battery")

    @factory.post_generation
    def roles(self, create: bool, extracted: Any, **kwargs: Any) -> None:
        for role in extracted or ():
            # get_or_create: a transactional test's flush removes the migration's groups.
            self.groups.add(Group.objects.get_or_create(name=role)[0])
        self.is_staff = "engineer" in (extracted or ())
        self.save()


@pytest.fixture(autouse=True)
def data_dir(settings: Any) -> Iterator[Path]:
    """Each test gets its own data folder (clones, worktrees, probe outputs). Not under
    pytest's tmp_path: that is private to root, and the sandbox user must reach worktrees."""
    path = Path(tempfile.mkdtemp(prefix="infraops-test-"))
    path.chmod(0o755)
    settings.DATA_DIR = path
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def engineer(db: None) -> User:
    return UserFactory.create(username="erin", roles=["engineer"])


@pytest.fixture
def reviewer(db: None) -> User:
    return UserFactory.create(username="rae", roles=["reviewer"])


@pytest.fixture
def viewer(db: None) -> User:
    return UserFactory.create(username="vic", roles=["viewer"])


def make_origin(tmp_path: Path, source: Path = EXAMPLE, name: str = "origin.git") -> Path:
    """A bare repository seeded from a folder, like load_example makes."""
    origin = tmp_path / name
    gitops.repo_init_from_dir(source, origin, branch="main", message="seed")
    return origin


@pytest.fixture
def example_source(tmp_path: Path) -> Path:
    """A writable copy of examples/tiny-serving to vary per test."""
    copy = tmp_path / "example-src"
    shutil.copytree(EXAMPLE, copy)
    return copy


@pytest.fixture
def example_target(db: None, tmp_path: Path) -> Target:
    return target_register(name="tiny-serving", repo_url=str(make_origin(tmp_path)),
                           base_branch="main", push_on_merge=True)


@pytest.fixture
def example_goal(example_target: Target, engineer: User) -> Goal:
    goal = Goal.objects.create(target=example_target, name="latency", probe="latency-bench",
                               metric="latency_ms", direction="minimize", relative_target=0.1,
                               owner=engineer)
    Boundary.objects.create(goal=goal, editable_paths="config/**", max_experiments=8)
    AcceptanceCriterion.objects.create(goal=goal, kind="relative", probe="latency-bench",
                                       metric="latency_ms", comparison="<=", value=-0.05)
    goal_snapshot(goal=goal, user=engineer)
    return goal
