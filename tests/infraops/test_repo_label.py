"""Pages name a target's repository without the server's absolute paths or a URL's password
(Target.repo_label); the admin editor keeps the URL as registered."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from infraops.models import Target, repo_label


@pytest.mark.parametrize(("url", "shown"), [
    ("https://github.com/fla-org/flash-linear-attention.git",
     "https://github.com/fla-org/flash-linear-attention.git"),
    ("https://bot:s3cret@git.example.com/team/repo.git", "https://bot@git.example.com/team/repo.git"),
    ("https://:s3cret@git.example.com/repo.git", "https://git.example.com/repo.git"),
    ("ssh://git@git.example.com/team/repo.git", "ssh://git@git.example.com/team/repo.git"),
    ("git@github.com:team/repo.git", "git@github.com:team/repo.git"),
    ("/srv/git/secret-project/kernels.git", "server folder: kernels.git"),
    ("file:///srv/git/kernels.git", "server folder: kernels.git"),
])
def test_a_repository_is_named_without_host_paths_or_passwords(url: str, shown: str) -> None:
    assert repo_label(url) == shown


def test_a_repository_in_the_data_folder_is_named_by_its_place_there(data_dir: Path) -> None:
    assert repo_label(str(data_dir / "examples" / "demo-kernels.git")) == \
        "data folder: examples/demo-kernels.git"


@pytest.mark.django_db
def test_the_dashboard_and_the_target_page_show_no_absolute_path(
        client: Client, engineer: User, example_target: Target) -> None:
    """The example's origin is a bare repository under pytest's temporary folder: its path was
    printed on both pages."""
    client.force_login(engineer)
    origin = example_target.repo_url
    assert origin.startswith("/")

    for path in ("/", f"/targets/{example_target.name}/"):
        page = client.get(path).content.decode()
        assert origin not in page, path
        assert f"server folder: {Path(origin).name} @ main" in page, path
