"""What a changed file is, from its path: its language, and whether it is a deployment file,
a test, documentation or a serving configuration. Pure: paths in, names out.

Contract: ``language(path, first_line)`` returns one of the ``LANGUAGES`` or ``None`` when
the classifier has no analyser for the file (an unknown language: the file is unclassified;
``FOREIGN``: code whose C-style comments alone are read). ``deployment_kind(path)`` names the
deployment artefact a path is (a Dockerfile of any name, a CI workflow, Kubernetes manifests,
...) or returns None; ``is_launcher(path)`` says whether a path starts or serves the
service. Matching is on repo-relative POSIX paths; folder names compare case-insensitively,
because ``Deploy/`` deploys as much as ``deploy/``.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import PurePosixPath

PYTHON = "python"
CYTHON = "cython"
NATIVE = "native"  # C, C++, CUDA, HIP, Objective-C++
SHADER = "shader"  # Metal, GLSL, OpenCL, HLSL, WGSL: every line is device code
SHELL = "shell"
CONFIG_TOML = "toml"
CONFIG_YAML = "yaml"
CONFIG_JSON = "json"
CONFIG_INI = "ini"
CONFIG_ENV = "env"
DOCKERFILE = "dockerfile"
HCL = "hcl"  # Terraform, Nomad, Packer
SYSTEMD = "systemd"
BUILD = "build"  # CMake, Make, Bazel, Meson
DOCS = "docs"
META = "meta"  # .gitignore and friends: what git and editors do with files
DEPENDENCIES = "dependencies"  # pinned requirements and lock files
# Code in a language with C-style comments that no analyser reads (Rust, Go, Java, JS, Zig,
# protobuf, ...): its comments are known, its code is not (see analysers).
FOREIGN = "foreign"

LANGUAGES = (PYTHON, CYTHON, NATIVE, SHADER, SHELL, CONFIG_TOML, CONFIG_YAML, CONFIG_JSON,
             CONFIG_INI, CONFIG_ENV, DOCKERFILE, HCL, SYSTEMD, BUILD, DOCS, META, DEPENDENCIES,
             FOREIGN)
CONFIG_LANGUAGES = (CONFIG_TOML, CONFIG_YAML, CONFIG_JSON, CONFIG_INI, CONFIG_ENV)

_BY_SUFFIX = {
    ".py": PYTHON, ".pyi": PYTHON, ".pyw": PYTHON,
    ".pyx": CYTHON, ".pxd": CYTHON, ".pxi": CYTHON,
    ".c": NATIVE, ".h": NATIVE, ".cc": NATIVE, ".cpp": NATIVE, ".cxx": NATIVE, ".c++": NATIVE,
    ".hpp": NATIVE, ".hh": NATIVE, ".hxx": NATIVE, ".h++": NATIVE, ".inl": NATIVE, ".inc": NATIVE,
    ".ipp": NATIVE, ".tpp": NATIVE, ".cu": NATIVE, ".cuh": NATIVE, ".hip": NATIVE,
    ".m": NATIVE, ".mm": NATIVE, ".cuinc": NATIVE,
    ".metal": SHADER, ".comp": SHADER, ".glsl": SHADER, ".vert": SHADER, ".frag": SHADER,
    ".cl": SHADER, ".hlsl": SHADER, ".wgsl": SHADER, ".spvasm": SHADER, ".ptx": SHADER,
    ".sh": SHELL, ".bash": SHELL, ".zsh": SHELL, ".ksh": SHELL,
    ".toml": CONFIG_TOML, ".yaml": CONFIG_YAML, ".yml": CONFIG_YAML, ".json": CONFIG_JSON,
    ".jsonc": CONFIG_JSON, ".json5": CONFIG_JSON, ".ini": CONFIG_INI, ".cfg": CONFIG_INI,
    ".conf": CONFIG_INI, ".properties": CONFIG_INI, ".env": CONFIG_ENV,
    ".tf": HCL, ".tfvars": HCL, ".hcl": HCL,
    ".service": SYSTEMD, ".socket": SYSTEMD, ".timer": SYSTEMD, ".mount": SYSTEMD,
    ".cmake": BUILD, ".mk": BUILD, ".mak": BUILD, ".bzl": BUILD, ".bazel": BUILD, ".gn": BUILD,
    ".gni": BUILD,
    ".md": DOCS, ".markdown": DOCS, ".rst": DOCS, ".txt": DOCS, ".adoc": DOCS,
    ".asciidoc": DOCS, ".org": DOCS, ".tex": DOCS, ".ipynb": DOCS, ".svg": DOCS,
    ".lock": DEPENDENCIES,
    ".rs": FOREIGN, ".go": FOREIGN, ".java": FOREIGN, ".kt": FOREIGN, ".kts": FOREIGN,
    ".scala": FOREIGN, ".swift": FOREIGN, ".zig": FOREIGN, ".js": FOREIGN, ".jsx": FOREIGN,
    ".mjs": FOREIGN, ".cjs": FOREIGN, ".ts": FOREIGN, ".tsx": FOREIGN, ".dart": FOREIGN,
    ".cs": FOREIGN, ".proto": FOREIGN, ".mojo": FOREIGN,
}
_BY_NAME = {
    "dockerfile": DOCKERFILE, "containerfile": DOCKERFILE, "cmakelists.txt": BUILD,
    "makefile": BUILD, "gnumakefile": BUILD, "meson.build": BUILD, "meson_options.txt": BUILD,
    "build": BUILD, "workspace": BUILD, "module.bazel": BUILD, "sconstruct": BUILD,
    "justfile": BUILD, "jenkinsfile": BUILD, "procfile": SHELL, "caddyfile": CONFIG_INI,
    ".env": CONFIG_ENV, ".gitignore": META, ".gitattributes": META, ".gitmodules": META,
    ".editorconfig": META, ".mailmap": META, "codeowners": META, "owners": META,
    ".dockerignore": DOCKERFILE, ".clang-format": CONFIG_YAML, ".clang-tidy": CONFIG_YAML,
    ".flake8": CONFIG_INI, ".pylintrc": CONFIG_INI, ".coveragerc": CONFIG_INI,
    "pipfile": DEPENDENCIES, "go.sum": DEPENDENCIES, "go.mod": DEPENDENCIES,
    "manifest.in": META, "py.typed": META, ".python-version": META, ".bazelversion": META,
    ".bazelrc": BUILD, ".nvmrc": META, ".npmrc": META, "setup.cfg": CONFIG_INI,
}
_DOC_STEMS = ("readme", "changelog", "changes", "history", "license", "licence", "copying",
              "authors", "contributors", "contributing", "notice", "maintainers", "security",
              "code_of_conduct", "citation", "news", "todo", "version")
_DEPENDENCY_NAME = re.compile(
    r"(?i)^(?:requirements|constraints|dev-requirements)[\w.-]*\.(?:txt|in)$")
# A requirements file under another name: `*-requirements.txt`, `*_overrides.txt`, or any
# text file in a requirements or dependencies folder (`requirements/base.txt`).
_DEPENDENCY_FOLDER = re.compile(r"(?i)(?:^|/)(?:requirements|dependencies|deps)/|"
                                r"[\w.-](?:requirements|constraints|overrides)\.(?:txt|in)$")
_SHEBANG = re.compile(r"^#!\s*(?:/usr/bin/env\s+(?:-S\s+)?)?(?:/\S*/)?(\w+)")

# Deployment artefacts: any change to them changes what production runs. (kind, globs)
_DEPLOYMENT: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("a CI workflow: what is built, tested and released", (
        ".github/workflows/**", ".github/actions/**", ".gitlab-ci.yml", ".gitlab-ci.yaml",
        ".gitlab/ci/**", ".circleci/**", "**/Jenkinsfile", "**/Jenkinsfile.*", "**/jenkinsfile.*",
        "**/*.jenkinsfile", "azure-pipelines.yml",
        ".azure-pipelines/**", ".buildkite/**", ".travis.yml", "bitbucket-pipelines.yml",
        "**/cloudbuild.yaml", "**/cloudbuild.yml", ".drone.yml", "**/buildspec.yml",
        "appveyor.yml", ".woodpecker.yml", ".woodpecker/**", ".tekton/**",
        # A project's own CI folder: its job matrices (which GPU a job runs on, which
        # projects it tests) and the scripts its jobs run (seventh round).
        "ci/**", ".ci/**")),
    ("a container image build: what production runs", (
        "**/Dockerfile", "**/Dockerfile.*", "**/*.Dockerfile", "**/*.dockerfile",
        "**/Containerfile", "**/.dockerignore", "**/docker-bake.hcl")),
    ("docker compose services", (
        "**/docker-compose*.yml", "**/docker-compose*.yaml", "**/compose.yml", "**/compose.yaml",
        "**/compose.*.yml", "**/compose.*.yaml")),
    ("Kubernetes manifests", (
        "**/k8s/**", "**/kubernetes/**", "**/kube/**", "**/kustomize/**",
        "**/kustomization.yaml", "**/kustomization.yml", "**/*.k8s.yaml", "**/*.k8s.yml",
        "**/skaffold.yaml", "**/manifests/**/*.yaml", "**/manifests/**/*.yml")),
    ("a Helm chart", ("**/helm/**", "**/charts/**", "**/Chart.yaml", "**/values.yaml",
                      "**/values.yml", "**/values-*.yaml", "**/values-*.yml", "**/values.*.yaml")),
    ("Terraform or HashiCorp infrastructure", (
        "**/*.tf", "**/*.tfvars", "**/*.hcl", "**/terraform/**", "**/terragrunt/**")),
    ("a systemd unit", ("**/*.service", "**/*.socket", "**/*.timer", "**/*.mount",
                        "**/systemd/**")),
    ("deployment configuration", (
        "**/deploy/**", "**/deployment/**", "**/deployments/**", "**/infra/**",
        "**/infrastructure/**", "**/ansible/**", "**/playbooks/**", "**/Procfile",
        "**/fly.toml", "**/app.yaml", "**/render.yaml", "**/serverless.yml", "**/nginx/**",
        "**/nginx.conf", "**/*.nginx", "**/supervisord.conf", "**/gunicorn.conf.py",
        "**/uwsgi.ini", "**/Caddyfile", "**/envoy.yaml", "**/.platform/**")),
)
_TOOLING = (
    "**/pyproject.toml", "**/setup.cfg", "**/tox.ini", "**/pytest.ini", "**/mypy.ini",
    "**/.flake8", "**/.pylintrc", "**/ruff.toml", "**/.ruff.toml", "**/.coveragerc",
    "**/.isort.cfg", "**/.bumpversion.cfg", "**/.pre-commit-config.yaml",
    "**/.pre-commit-hooks.yaml", "**/mkdocs.yml", "**/mkdocs.yaml", "**/.readthedocs.yaml",
    "**/.readthedocs.yml", "**/codecov.yml", "**/.codecov.yml", "**/package.json",
    "**/package-lock.json", "**/tsconfig*.json", "**/.eslintrc*", "**/.prettierrc*",
    "**/renovate.json", "**/.markdownlint*", "**/cspell.json", "**/typos.toml",
    "**/_typos.toml", "**/environment.yml", "**/environment.yaml", "**/.clang-format",
    "**/.clang-tidy", "**/CITATION.cff", ".github/*.yml", ".github/*.yaml",
    ".github/ISSUE_TEMPLATE/**", ".github/PULL_REQUEST_TEMPLATE/**", "**/.vscode/**",
    "**/.devcontainer/**", "**/.idea/**", "**/Cargo.toml", "**/.yamllint*", "**/.golangci.yml",
    "**/.gitlab/issue_templates/**", "**/dependabot.yml", "**/.github/labeler.yml",
)
_TEST_DIRS = frozenset({"test", "tests", "testing", "unittests", "unit_tests", "__tests__",
                        "testdata", "test_data", "fixtures"})
_TEST_NAME = re.compile(r"(?i)^(?:tests?[_-].*|.*[_-]tests?|.*[_-]tests?[_-].*|conftest|.*\.test"
                        r"|.*_spec)\.[\w.]+$")
# JUnit's and its kin's naming (ninth round): `ResnetTest.java`, `PoolTests.kt`, `QueueSpec.scala`.
_CAMEL_TEST_NAME = re.compile(
    r"^[A-Z]\w*?(?:Tests?|Spec|IT)\.(?:java|kt|kts|scala|groovy|cs|swift)$")
_DOC_DIRS = frozenset({"docs", "doc", "documentation"})
# A configuration or script whose path says it serves is serving configuration as a whole.
_SERVING_WORDS = re.compile(r"(?i)(?:^|[^a-z])(?:serv(?:e|er|ers|ing)|deploy\w*|prod|"
                            r"production|inference|launch\w*|runtime|endpoints?|engine)"
                            r"(?:[^a-z]|$)")
_LAUNCH_SCRIPT = re.compile(r"(?i)(?:^|[^a-z])(?:serve|server|serving|launch\w*|start\w*|"
                            r"entrypoint|deploy\w*|run_server|startup|docker-entrypoint)"
                            r"(?:[^a-z]|$)")
_LAUNCHER_DIR = re.compile(r"(?i)launch\w*|entrypoints?")


@lru_cache(maxsize=4096)
def language(path: str, first_line: str = "") -> str | None:
    """The analyser for ``path``; ``first_line`` (a shebang) decides for files without a
    suffix. None: an unknown language."""
    pure = PurePosixPath(path)
    name = pure.name.lower()
    if name in _BY_NAME:
        return _BY_NAME[name]
    if _DEPENDENCY_NAME.match(pure.name) or (
            pure.suffix.lower() in (".txt", ".in") and _DEPENDENCY_FOLDER.search(path)
            and pure.stem.lower() not in _DOC_STEMS and not is_docs(path)):
        return DEPENDENCIES
    if name.startswith(".env") or name.endswith(".env"):
        return CONFIG_ENV
    if _is_dockerfile_name(name):
        return DOCKERFILE
    if name.startswith(("makefile", "gnumakefile")):
        return BUILD  # Makefile-flashinfer, Makefile.rocm: a make recipe of another name
    suffix = pure.suffix.lower()
    if suffix in _BY_SUFFIX:
        return _BY_SUFFIX[suffix]
    if pure.stem.lower() in _DOC_STEMS or name in _DOC_STEMS:
        return DOCS
    if is_docs(path):
        return DOCS
    shebang = _SHEBANG.match(first_line)
    if shebang:
        interpreter = shebang.group(1)
        if interpreter.startswith("python"):
            return PYTHON
        if interpreter in ("sh", "bash", "zsh", "ksh", "dash"):
            return SHELL
    return None


def _is_dockerfile_name(name: str) -> bool:
    """Dockerfile, Dockerfile_amd, Dockerfile-rocm, Containerfile.cpu, cuda.dockerfile."""
    return name.startswith(("dockerfile", "containerfile")) or name.endswith(".dockerfile")


def describe_unknown(path: str) -> str:
    """The reason an unknown file is unclassified: 'unknown language (.zig)'."""
    suffix = PurePosixPath(path).suffix
    return f"unknown language ({suffix})" if suffix else (
        f"unknown language (no file suffix: {PurePosixPath(path).name})")


def _glob_regex(globs: tuple[str, ...]) -> re.Pattern[str]:
    """The built-in globs as one regex, with ``glob_match``'s rules (segments split on '/',
    ``**`` any number of segments, ``*`` and ``?`` inside one): a path is tested against a
    hundred of them, and one regex is fifty times faster than the globs one by one."""
    parts = []
    for glob in globs:
        out = []
        for i, segment in enumerate(glob.split("/")):
            last = i == len(glob.split("/")) - 1
            if segment == "**":
                out.append(".*" if last else "(?:[^/]+/)*")
                continue
            text = "".join("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c)
                           for c in segment)
            out.append(text if last else text + "/")
        parts.append("".join(out))
    return re.compile("|".join(f"(?:{part})" for part in parts))


_DEPLOYMENT_RE = tuple((kind, _glob_regex(globs)) for kind, globs in _DEPLOYMENT)
_TOOLING_RE = _glob_regex(_TOOLING)


# Prose: a page under a deployment folder documents deployment, it deploys nothing.
_PROSE = (".md", ".markdown", ".rst", ".adoc", ".asciidoc", ".org")


@lru_cache(maxsize=4096)
def deployment_kind(path: str) -> str | None:
    """What deployment artefact ``path`` is, as a phrase for a reason; None if it is none (a
    page of prose is none, whatever folder it sits in: docs/deployment/guide.md)."""
    if path.lower().endswith(_PROSE):
        return None
    lowered = _lower_dirs(path)
    for kind, regex in _DEPLOYMENT_RE:
        if regex.fullmatch(lowered) or regex.fullmatch(path):
            return kind
    if _is_dockerfile_name(PurePosixPath(path).name.lower()):
        return _DEPLOYMENT[1][0]  # an image built from Dockerfile_intel is as deployed
    return None


@lru_cache(maxsize=4096)
def is_tooling(path: str) -> bool:
    """Developer tooling configuration (linters, docs builds, editors): no serving keys."""
    return bool(_TOOLING_RE.fullmatch(path))


@lru_cache(maxsize=4096)
def is_test(path: str) -> bool:
    """Test code and test data: it verifies production code and never runs in it."""
    pure = PurePosixPath(path)
    parts = [part.lower() for part in pure.parts[:-1]]
    return (bool(_TEST_DIRS.intersection(parts)) or bool(_TEST_NAME.match(pure.name))
            or bool(_CAMEL_TEST_NAME.match(pure.name)))


@lru_cache(maxsize=4096)
def is_docs(path: str) -> bool:
    parts = [part.lower() for part in PurePosixPath(path).parts[:-1]]
    return bool(parts) and parts[0] in _DOC_DIRS


@lru_cache(maxsize=4096)
def is_serving_path(path: str) -> bool:
    """Whether the path says the file configures serving (config/serving.toml, prod.env)."""
    return bool(_SERVING_WORDS.search(path))


@lru_cache(maxsize=4096)
def is_launcher(path: str) -> bool:
    """Whether the path says the file starts or serves the service: a launcher's folder
    (launcher/src/main.rs) or a name like server.cpp, serve.py, entrypoint.sh."""
    pure = PurePosixPath(path)
    return is_launch_script(path) or any(
        _LAUNCHER_DIR.fullmatch(part) for part in pure.parts[:-1])


@lru_cache(maxsize=4096)
def is_launch_script(path: str) -> bool:
    """Whether a script's name says it starts a service (scripts/serve_llama.sh)."""
    return bool(_LAUNCH_SCRIPT.search(PurePosixPath(path).stem))


def _lower_dirs(path: str) -> str:
    parts = path.split("/")
    return "/".join([part.lower() for part in parts[:-1]] + parts[-1:])
