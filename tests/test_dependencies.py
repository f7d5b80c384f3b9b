"""Dependencies point one way: skeletons → agents → reviews → infraops (the core), in imports,
migrations, foreign keys and templates alike; the project package (infraops.project) composes
them all and no app imports it. Each test names every crossing it finds."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest
from django.apps import apps
from django.db.migrations.loader import MigrationLoader
from django.template.backends.django import get_installed_libraries

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"infraops": 0, "reviews": 1, "agents": 2, "skeletons": 3}
PROJECT = "infraops.project"
PURE = "infraops.feedback"


def rank(module: str) -> int | None:
    """The layer of a module of ours (None for anything else); the project package is above
    every app."""
    if module == PROJECT or module.startswith(PROJECT + "."):
        return len(LAYERS)
    return LAYERS.get(module.partition(".")[0])


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def our_sources() -> dict[str, str]:
    """Every module of the apps, migrations aside (they are checked as a graph)."""
    return {module_name(path): path.read_text()
            for app in LAYERS for path in sorted((ROOT / app).rglob("*.py"))
            if "migrations" not in path.parts}


def import_edges(sources: Mapping[str, str]) -> dict[str, dict[str, int]]:
    """module -> {module of ours it imports: first line}, at any depth of the module (inside
    functions and TYPE_CHECKING blocks too: a deferred import is still a dependency)."""

    def resolve(name: str) -> str | None:
        while name and name not in sources:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, dict[str, int]] = {}
    for module, text in sources.items():
        found: dict[str, int] = {}
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                target = resolve(name)
                if target and target != module:
                    found.setdefault(target, node.lineno)
        edges[module] = found
    return edges


def upward_imports(sources: Mapping[str, str]) -> list[str]:
    crossings = []
    for module, targets in import_edges(sources).items():
        for target, line in targets.items():
            low, high = rank(module), rank(target)
            if low is not None and high is not None and high > low:
                crossings.append(f"{module} (line {line}) imports {target}")
    return sorted(crossings)


def import_circles(sources: Mapping[str, str]) -> list[list[str]]:
    """The strongly connected groups of two or more modules (Tarjan)."""
    edges = {module: set(targets) for module, targets in import_edges(sources).items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(circles)


def is_services_tasks(circle: Iterable[str]) -> bool:
    """The one circle allowed: a services module that enqueues its app's tasks after commit
    (imported inside a function), and the tasks module that calls the services."""
    members = sorted(circle)
    return (len(members) == 2 and sum(m.endswith(".tasks") for m in members) == 1
            and any(m.endswith("services") for m in members))


def test_no_module_imports_an_app_above_its_own() -> None:
    assert upward_imports(our_sources()) == []


def test_the_check_names_a_planted_upward_import() -> None:
    planted = {"infraops.views": "def f():\n    from agents.models import AgentRun\n",
               "agents.models": "", "reviews.gate": "import skeletons.models\n",
               "skeletons.models": "", "agents.views": "from infraops.project import urls\n",
               "infraops.project.urls": "from agents import views\n"}
    assert upward_imports(planted) == [
        "agents.views (line 1) imports infraops.project.urls",
        "infraops.views (line 2) imports agents.models",
        "reviews.gate (line 1) imports skeletons.models",
    ]


def test_the_only_import_circles_are_services_and_their_tasks() -> None:
    circles = import_circles(our_sources())
    assert [c for c in circles if not is_services_tasks(c)] == []
    assert circles, "the services ⇄ tasks idiom is expected somewhere: is the walk blind?"


def test_the_circle_check_finds_a_planted_circle() -> None:
    planted = {"agents.tools.run": "from agents.policies import llm\n",
               "agents.policies.llm": "from agents.tools import run\n",
               "agents.services": "def f():\n    from agents.tasks import step\n",
               "agents.tasks": "from agents import services\n"}
    circles = import_circles(planted)
    assert circles == [["agents.policies.llm", "agents.tools.run"],
                       ["agents.services", "agents.tasks"]]
    assert [is_services_tasks(c) for c in circles] == [False, True]


def test_no_migration_depends_on_an_app_above_its_own() -> None:
    graph = MigrationLoader(None, ignore_no_migrations=True).graph
    crossings = sorted(
        f"{app}.{name} depends on {parent.key[0]}.{parent.key[1]}"
        for (app, name), node in graph.node_map.items() if app in LAYERS
        for parent in node.parents
        if parent.key[0] in LAYERS and LAYERS[parent.key[0]] > LAYERS[app])
    assert crossings == []


def test_no_model_has_a_relation_to_an_app_above_its_own() -> None:
    crossings = []
    for model in apps.get_models():
        app = model._meta.app_label
        for field in model._meta.get_fields():
            related = field.related_model
            if app not in LAYERS or not field.is_relation or related is None \
                    or field.auto_created:  # the reverse side of a relation declared above
                continue
            other = related._meta.app_label  # type: ignore[union-attr]
            if other in LAYERS and LAYERS[other] > LAYERS[app]:
                crossings.append(f"{model._meta.label}.{field.name} -> {related._meta.label}")  # type: ignore[union-attr]
    assert sorted(crossings) == []


LOAD = re.compile(r"{%\s*load\s+([^%]+?)\s*%}")
TEMPLATE_REF = re.compile(r"{%\s*(?:include|extends)\s+[\"']([\w-]+)/")


def test_no_template_uses_a_tag_library_or_template_of_an_app_above_its_own() -> None:
    libraries = get_installed_libraries()  # tag library name -> its module
    crossings = []
    for app, layer in LAYERS.items():
        for path in sorted((ROOT / "templates" / app).rglob("*.html")):
            text = path.read_text()
            names = {name for found in LOAD.findall(text) for name in found.split()
                     if name != "from"}
            for name in sorted(names):
                owner = libraries.get(name, "").partition(".")[0]
                if owner in LAYERS and LAYERS[owner] > layer:
                    crossings.append(f"{path.relative_to(ROOT)} loads {name} ({owner})")
            for owner in sorted(set(TEMPLATE_REF.findall(text))):
                if owner in LAYERS and LAYERS[owner] > layer:
                    crossings.append(f"{path.relative_to(ROOT)} includes a template of {owner}")
    assert crossings == []


def pure_modules() -> list[str]:
    return sorted(module_name(path) for path in (ROOT / PURE.replace(".", "/")).glob("*.py"))


def test_the_pure_analysis_imports_no_django_and_no_celery() -> None:
    script = ("import importlib, sys\n"
              f"for name in {pure_modules()!r}:\n"
              "    importlib.import_module(name)\n"
              "print(sorted({m.partition('.')[0] for m in sys.modules} & {'django', 'celery'}))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert len(pure_modules()) >= 7


@pytest.mark.parametrize("module", ["infraops", "infraops.feedback", PURE + ".stats"])
def test_importing_the_core_package_starts_nothing(module: str) -> None:
    script = (f"import sys, {module}\n"
              "print(sorted({m.partition('.')[0] for m in sys.modules} & {'django', 'celery'}))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr


def pinned_names(path: Path) -> set[str]:
    """The distributions a requirements file pins, normalized (PEP 503)."""
    names = set()
    for line in path.read_text().splitlines():
        found = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line.split("#")[0])
        if found:
            names.add(re.sub(r"[-_.]+", "-", found[1]).lower())
    return names


def test_every_package_the_product_imports_is_pinned_by_name() -> None:
    # A package that only arrives as another's dependency may vanish with that one's next
    # release, and bench/gpu_device.sh leaves such wheels out of what it carries to a GPU host
    # (websockets was imported by infraops/consumers.py and pinned nowhere: the GPU standalone
    # did not start).
    from importlib.metadata import packages_distributions

    providers = packages_distributions()
    pinned = pinned_names(ROOT / "requirements.txt") | pinned_names(ROOT / "requirements-gpu.txt")
    ours = set(LAYERS) | {"tests", "bench"}
    unpinned: dict[str, str] = {}
    for module, text in our_sources().items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                if top in ours or top in sys.stdlib_module_names or top not in providers:
                    continue  # ours, the standard library, or not installed here (torch)
                dists = {re.sub(r"[-_.]+", "-", d).lower() for d in providers[top]}
                if not dists & pinned:
                    unpinned.setdefault(top, f"{module} (line {node.lineno})")
    assert unpinned == {}, "imported but pinned in no requirements file: " + ", ".join(
        f"{top} by {where}" for top, where in sorted(unpinned.items()))
