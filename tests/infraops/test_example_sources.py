"""infraops/example_sources.py: an example built from a pinned release is that release, as
installed and unmodified, with exactly the edits its source.toml names; anything else is
refused in a sentence that says what to do.

The real fla-core 0.6.0 is installed in the virtual environment (requirements-gpu.txt); a
tampered install is a small fake distribution made in a temporary folder."""

from __future__ import annotations

import base64
import hashlib
import re
from importlib import metadata
from pathlib import Path

import pytest
from django.conf import settings

from infraops.example_sources import (
    INSTALL_COMMAND,
    Edit,
    ExampleSource,
    ExampleSourceError,
    Release,
    commit_message,
    source_parse,
    source_read,
    tree_build,
)

EXAMPLES = Path(settings.BASE_DIR) / "examples"
FLA = Release(name="fla-core", version="0.6.0", packages=("fla",))
TF32X3 = b"CP_DOT_PRECISION = tl.constexpr('ieee' if IS_NPU else 'tf32x3')"
TF32 = b"CP_DOT_PRECISION = tl.constexpr('ieee' if IS_NPU else 'tf32')"
MERGE = "fla/ops/cp/chunk_merge.py"

VALID = '''
[[distribution]]
name = "fla-core"
version = "0.6.0"
packages = ["fla"]

[[edit]]
file = "fla/ops/cp/chunk_merge.py"
old = "a"
new = ""
why = "because"
'''


def fake_release(site: Path, files: dict[str, bytes], *, name: str = "fake-release",
                 version: str = "1.0", license_file: bool = True) -> Path:
    """A distribution installed in ``site`` as pip leaves one: its files, and a dist-info with
    METADATA and a RECORD giving each file's sha256 (the license in licenses/, PEP 639)."""
    dist_info = f"{name.replace('-', '_')}-{version}.dist-info"
    fields = f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\n"
    everything = dict(files)
    if license_file:
        fields += "License-File: LICENSE\n"
        everything[f"{dist_info}/licenses/LICENSE"] = b"Permission is hereby granted.\n"
    everything[f"{dist_info}/METADATA"] = fields.encode()
    record = []
    for path, data in everything.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_bytes(data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    (site / dist_info / "RECORD").write_text("\n".join(record) + "\n")
    return site


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "site-packages"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    return folder


@pytest.fixture
def example(tmp_path: Path) -> Path:
    """An example folder of its own: a README and its source.toml (left out of the tree)."""
    folder = tmp_path / "example"
    folder.mkdir()
    (folder / "README.md").write_text("An example.\n")
    (folder / "source.toml").write_text(VALID)
    return folder


FAKE = Release(name="fake-release", version="1.0", packages=("pkg",))
FAKE_FILES = {"pkg/__init__.py": b"", "pkg/mod.py": b"X = 1\nY = 2\n"}


def build(example: Path, dest: Path, *releases: Release, edits: tuple[Edit, ...] = ()) -> Path:
    tree_build(example=example, source=ExampleSource(releases=releases, edits=edits), dest=dest)
    return dest


# --- Building from the installed release ----------------------------------------------------


def test_the_fla_cp_tree_is_the_installed_release_with_its_one_edit_and_license(
    tmp_path: Path,
) -> None:
    source = source_read(EXAMPLES / "fla-cp")
    assert source is not None and source.releases == (FLA,)

    tree = build(EXAMPLES / "fla-cp", tmp_path / "tree", *source.releases, edits=source.edits)

    assert (tree / "fla/ops/kda/fused_recurrent.py").is_file()
    assert not list(tree.rglob("*.pyc")) and not list(tree.rglob("__pycache__"))
    assert not (tree / "source.toml").exists()
    merge = (tree / MERGE).read_bytes()
    assert merge.count(TF32) == 1 and TF32X3 not in merge
    assert "Permission is hereby granted" in (tree / "LICENSES/fla-core/LICENSE").read_text()


def test_the_fla_kda_tree_is_the_release_as_it_is(tmp_path: Path) -> None:
    source = source_read(EXAMPLES / "fla-kda")
    assert source is not None and source.releases == (FLA,) and source.edits == ()

    tree = build(EXAMPLES / "fla-kda", tmp_path / "tree", *source.releases)

    assert TF32X3 in (tree / MERGE).read_bytes()
    installed = Path(str(metadata.distribution("fla-core").locate_file(
        "fla/ops/kda/fused_recurrent.py")))
    assert (tree / "fla/ops/kda/fused_recurrent.py").read_bytes() == installed.read_bytes()


def test_requirements_gpu_pins_the_releases_the_examples_are_built_from() -> None:
    pinned = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (
        Path(settings.BASE_DIR) / "requirements-gpu.txt").read_text(), re.MULTILINE))
    for name in ("fla-kda", "fla-cp"):
        source = source_read(EXAMPLES / name)
        assert source is not None
        assert {r.name: r.version for r in source.releases}.items() <= pinned.items()


def test_the_commit_message_names_the_release_and_why_each_edit() -> None:
    source = source_read(EXAMPLES / "fla-cp")
    assert source is not None
    message = commit_message("fla-cp", source)
    assert message.startswith("fla-cp: the bundled example, built from fla-core 0.6.0 (fla)\n")
    assert "fla/ops/cp/chunk_merge.py: the base is the state before the TF32 fix" in message


def test_a_fake_release_copies_its_package_and_license_and_the_examples_own_files(
    site: Path, example: Path, tmp_path: Path,
) -> None:
    fake_release(site, FAKE_FILES | {"pkg/__pycache__/mod.cpython-311.pyc": b"\0",
                                     "other/skipped.py": b""})

    tree = build(example, tmp_path / "tree", FAKE)

    files = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file())
    assert files == ["LICENSES/fake-release/LICENSE", "README.md", "pkg/__init__.py",
                     "pkg/mod.py"]


# --- Refusals ------------------------------------------------------------------------------


def test_a_tampered_installed_file_is_refused_by_name(
    site: Path, example: Path, tmp_path: Path,
) -> None:
    fake_release(site, FAKE_FILES)
    (site / "pkg/mod.py").write_bytes(b"X = 1\nY = 3\n")

    with pytest.raises(ExampleSourceError, match=r"pkg/mod\.py of the installed fake-release "
                                                 r"1\.0 differs from the release"):
        build(example, tmp_path / "tree", FAKE)


def test_a_deleted_installed_file_is_refused_by_name(
    site: Path, example: Path, tmp_path: Path,
) -> None:
    fake_release(site, FAKE_FILES)
    (site / "pkg/mod.py").unlink()

    with pytest.raises(ExampleSourceError, match=r"pkg/mod\.py of the installed fake-release "
                                                 r"1\.0 is missing"):
        build(example, tmp_path / "tree", FAKE)


def test_a_release_without_a_license_file_is_not_copied(
    site: Path, example: Path, tmp_path: Path,
) -> None:
    fake_release(site, FAKE_FILES, license_file=False)
    with pytest.raises(ExampleSourceError, match="holds no license file"):
        build(example, tmp_path / "tree", FAKE)


def test_a_package_the_release_does_not_have_is_refused(
    site: Path, example: Path, tmp_path: Path,
) -> None:
    fake_release(site, FAKE_FILES)
    wanted = Release(name="fake-release", version="1.0", packages=("pkg", "nope"))
    with pytest.raises(ExampleSourceError, match=r"fake-release 1\.0 has no package nope"):
        build(example, tmp_path / "tree", wanted)


def test_a_release_file_may_not_replace_one_of_the_examples_own(
    site: Path, example: Path, tmp_path: Path,
) -> None:
    fake_release(site, FAKE_FILES)
    (example / "pkg").mkdir()
    (example / "pkg/mod.py").write_text("mine\n")
    with pytest.raises(ExampleSourceError, match=r"pkg/mod\.py of fake-release 1\.0 is also "
                                                 r"one of the example's own files"):
        build(example, tmp_path / "tree", FAKE)


@pytest.mark.parametrize(("old", "count"), [("Z = 9", 0), ("= ", 2)], ids=["absent", "twice"])
def test_an_edit_whose_old_text_is_not_there_exactly_once_is_refused_with_the_count(
    site: Path, example: Path, tmp_path: Path, old: str, count: int,
) -> None:
    fake_release(site, FAKE_FILES)
    edit = Edit(file="pkg/mod.py", old=old, new="", why="test")
    with pytest.raises(ExampleSourceError, match=rf"edit\[1\] of source\.toml: its old text "
                                                 rf"occurs {count} times in pkg/mod\.py"):
        build(example, tmp_path / "tree", FAKE, edits=(edit,))


def test_an_edit_of_a_file_the_tree_does_not_hold_is_refused(
    site: Path, example: Path, tmp_path: Path,
) -> None:
    fake_release(site, FAKE_FILES)
    edit = Edit(file="pkg/gone.py", old="X", new="", why="test")
    with pytest.raises(ExampleSourceError, match=r"pkg/gone\.py is not a file of the built"):
        build(example, tmp_path / "tree", FAKE, edits=(edit,))


def test_a_release_not_installed_gives_the_command_that_installs_it(
    example: Path, tmp_path: Path,
) -> None:
    missing = Release(name="not-installed-anywhere", version="1.0", packages=("x",))
    with pytest.raises(ExampleSourceError) as refused:
        build(example, tmp_path / "tree", missing)
    assert str(refused.value) == (f"not-installed-anywhere is not installed: run "
                                  f"`{INSTALL_COMMAND}`")


def test_another_installed_version_is_named_with_the_command(
    example: Path, tmp_path: Path,
) -> None:
    older = Release(name="fla-core", version="0.5.0", packages=("fla",))
    with pytest.raises(ExampleSourceError) as refused:
        build(example, tmp_path / "tree", older)
    assert str(refused.value) == (
        "fla-core 0.6.0 is installed, but the example is built from 0.5.0: run "
        "`pip install --require-hashes --no-deps -r requirements-gpu.txt`")


# --- Parsing source.toml -------------------------------------------------------------------


def test_a_valid_source_parses() -> None:
    assert source_parse(VALID) == ExampleSource(
        releases=(FLA,), edits=(Edit(file=MERGE, old="a", new="", why="because"),))


MALFORMED = [
    pytest.param("[[distribution]\nname = 1", r"line 1, \(top level\): TOML syntax error",
                 id="bad-toml"),
    pytest.param("", r"\(top level\), field distribution: there is no \[\[distribution\]\]",
                 id="no-distribution"),
    pytest.param('distribution = "fla-core"',
                 r"line 1, \(top level\), field distribution: distribution must be an array of "
                 r"tables", id="distribution-not-tables"),
    pytest.param(VALID.replace('version = "0.6.0"\n', ""),
                 r"line 2, distribution\[1\], field version: version is required",
                 id="missing-version"),
    pytest.param(VALID.replace('version = "0.6.0"', "version = 0.6"),
                 r"line 4, distribution\[1\], field version: version must be a non-empty string, "
                 r"got 0\.6", id="version-not-a-string"),
    pytest.param(VALID.replace('packages = ["fla"]', 'packages = "fla"'),
                 r"line 5, distribution\[1\], field packages: packages must be an array of "
                 r"strings", id="packages-not-a-list"),
    pytest.param(VALID.replace('packages = ["fla"]', 'packages = ["fla/ops"]'),
                 r"field packages: top-level package 'fla/ops' must be a top-level package name",
                 id="package-not-top-level"),
    pytest.param(VALID.replace("version =", "verison ="),
                 r"line 4, distribution\[1\], field verison: unknown distribution key 'verison' "
                 r"\(did you mean 'version'\?\)", id="unknown-key"),
    pytest.param('mirror = "x"\n' + VALID,
                 r"line 1, \(top level\), field mirror: unknown top-level key 'mirror'",
                 id="unknown-top-level-key"),
    pytest.param(VALID.replace('why = "because"\n', ""),
                 r"line 7, edit\[1\], field why: why is required", id="edit-without-why"),
    pytest.param(VALID.replace('new = ""\n', ""),
                 r"line 7, edit\[1\], field new: new is required", id="edit-without-new"),
    pytest.param(VALID.replace('old = "a"', 'old = ""'),
                 r"line 9, edit\[1\], field old: old must be a non-empty string",
                 id="edit-empty-old"),
    pytest.param(VALID.replace('file = "fla/ops/cp/chunk_merge.py"', 'file = "../setup.py"'),
                 r"line 8, edit\[1\], field file: file '../setup.py' contains '\.\.'",
                 id="edit-outside-the-tree"),
    pytest.param(VALID + VALID.split("[[edit]]")[0],
                 r"line 14, distribution\[2\], field name: 'fla-core' is named by an earlier",
                 id="distribution-twice"),
]


@pytest.mark.parametrize(("text", "message"), MALFORMED)
def test_a_malformed_source_is_refused_naming_the_line_and_field(text: str, message: str) -> None:
    with pytest.raises(ExampleSourceError, match=r"^source\.toml: .*" + message):
        source_parse(text)


def test_a_source_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    (tmp_path / "source.toml").write_bytes(b"\xff\xfe")
    with pytest.raises(ExampleSourceError, match=r"source\.toml is not UTF-8 text"):
        source_read(tmp_path)


def test_a_folder_without_source_toml_is_its_own_example(tmp_path: Path) -> None:
    assert source_read(tmp_path) is None
