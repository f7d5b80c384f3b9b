"""The repository URL policy (infraops/repourls.py): every kind of URL an attacker or a careless
user typed (issue 28), refused or allowed, on a table of cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from infraops.repourls import RepoUrlPolicy, RepoUrlRefused, repo_url_check

NAMES = {
    "github.com": ["140.82.121.3"],
    "git.example.com": ["93.184.216.34"],
    "metadata.internal": ["169.254.169.254"],
    "intranet.example.com": ["10.1.2.3"],
    "mixed.example.com": ["93.184.216.34", "127.0.0.1"],
    "localhost": ["127.0.0.1", "::1"],
}


def resolver(host: str) -> list[str]:
    return NAMES.get(host, [host] if host[0].isdigit() or ":" in host else [])


def check(url: str, policy: RepoUrlPolicy | None = None) -> None:
    repo_url_check(url, policy or RepoUrlPolicy(), resolver=resolver)


@pytest.mark.parametrize("url", [
    "https://github.com/org/repo.git",
    "ssh://git@github.com/org/repo.git",
    "git@github.com:org/repo.git",
    "https://93.184.216.34/x.git",
], ids=["https", "ssh-url", "scp-like", "public-ip"])
def test_it_allows_https_and_ssh_to_public_hosts_by_default(url: str) -> None:
    check(url)


@pytest.mark.parametrize(("url", "words"), [
    ("fd::17", "remote helper"),
    ("ext::sh -c touch% /tmp/pwned", "remote helper"),
    ("persistent-https::github.com/x", "remote helper"),
    ("--upload-pack=touch /tmp/x", "option"),
    ("-oProxyCommand=x", "option"),
    ("git://127.0.0.1:9418/x", "git:// URLs are not allowed"),
    ("http://github.com/x.git", "http:// URLs are not allowed"),
    ("ftp://github.com/x.git", "ftp:// URLs are not allowed"),
    ("https://169.254.169.254/latest/meta-data", "link-local"),
    ("https://metadata.internal/x.git", "169.254.169.254"),
    ("https://127.0.0.1/x.git", "loopback"),
    ("https://localhost/x.git", "loopback"),
    ("ssh://[::1]/x.git", "loopback"),
    ("git@10.0.0.1:x.git", "private"),
    ("https://intranet.example.com/x.git", "10.1.2.3"),
    ("https://mixed.example.com/x.git", "127.0.0.1"),
    ("https://nowhere.invalid/x.git", "cannot be resolved"),
    ("ssh://-oProxyCommand=x/y", "no usable host"),
    ("https://github.com/x\n.git", "control characters"),
    ("relative/path.git", "neither a URL"),
    ("", "empty"),
], ids=lambda value: value if len(value) < 20 else value[:20])
def test_it_refuses_what_the_server_must_not_reach(url: str, words: str) -> None:
    with pytest.raises(RepoUrlRefused, match=words):
        check(url)


def test_allowed_hosts_are_names_or_domains() -> None:
    policy = RepoUrlPolicy(hosts=("github.com", ".example.com"))

    check("https://github.com/x.git", policy)
    check("https://git.example.com/x.git", policy)
    with pytest.raises(RepoUrlRefused, match="not one this installation allows"):
        check("https://gitlab.com/x.git", policy)
    with pytest.raises(RepoUrlRefused, match="not one this installation allows"):
        check("https://evil-example.com/x.git", policy)


def test_an_admin_may_allow_private_addresses_and_other_schemes() -> None:
    policy = RepoUrlPolicy(schemes=frozenset({"https", "git"}), private_addresses=True)

    check("git://10.0.0.1/x.git", policy)
    check("https://localhost/x.git", policy)


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    names = ["data", "checkout", "allowed", "elsewhere"]
    folders = {name: tmp_path / name for name in names}
    for folder in folders.values():
        folder.mkdir()
    return folders


def local_policy(layout: dict[str, Path], *roots: Path) -> RepoUrlPolicy:
    return RepoUrlPolicy(local_roots=roots or (layout["allowed"],),
                         protected=(layout["data"], layout["checkout"]))


def test_local_paths_come_only_from_the_folders_an_admin_names(layout: dict[str, Path]) -> None:
    policy = local_policy(layout)

    check(str(layout["allowed"] / "a.git"), policy)
    check(f"file://{layout['allowed']}/a.git", policy)
    with pytest.raises(RepoUrlRefused, match="not inside a folder"):
        check(str(layout["elsewhere"] / "a.git"), policy)
    with pytest.raises(RepoUrlRefused, match="allows only"):
        check(str(layout["allowed"] / "a.git"))


@pytest.mark.parametrize("name", ["data", "checkout"])
def test_the_data_folder_and_the_checkout_are_never_reachable(
    layout: dict[str, Path], name: str
) -> None:
    inside = layout[name] / "repos" / "target-2.git"
    everything = local_policy(layout, layout[name].parent)

    for url in (str(inside), f"file://{inside}", str(layout[name])):
        with pytest.raises(RepoUrlRefused, match="data folder or checkout"):
            check(url, everything)


def test_a_root_above_a_protected_folder_is_ignored(layout: dict[str, Path]) -> None:
    """Naming the parent of the data folder would otherwise allow every sibling of it."""
    with pytest.raises(RepoUrlRefused, match="not inside a folder"):
        check(str(layout["elsewhere"] / "a.git"), local_policy(layout, layout["data"].parent))


def test_a_symlink_or_dot_dot_into_the_data_folder_is_followed(layout: dict[str, Path]) -> None:
    link = layout["allowed"] / "innocent.git"
    link.symlink_to(layout["data"])
    policy = local_policy(layout)

    for url in (str(link), f"{layout['allowed']}/../data/x.git"):
        with pytest.raises(RepoUrlRefused, match="data folder or checkout"):
            check(url, policy)


def test_trusted_roots_named_by_service_code_may_lie_in_the_data_folder(
    layout: dict[str, Path]
) -> None:
    examples = layout["data"] / "examples"
    policy = RepoUrlPolicy(protected=(layout["data"],), trusted_roots=(examples,))

    check(str(examples / "tiny-serving.git"), policy)
    with pytest.raises(RepoUrlRefused, match="data folder or checkout"):
        check(str(layout["data"] / "repos" / "target-1.git"), policy)
