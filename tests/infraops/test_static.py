"""Static files: our own plotly.js bundle, no larger than the charts need, and collected files
served under hashed names, compressed, with a long-lived cache."""

from __future__ import annotations

import gzip
import re
from pathlib import Path
from typing import Any

import plotly
import pytest
from django.conf import settings
from django.core.management import call_command
from django.http import HttpResponse
from django.templatetags.static import static
from django.test import RequestFactory
from whitenoise.middleware import WhiteNoiseMiddleware

from infraops.project.staticfiles import HashedStaticFiles

BUNDLE = Path(settings.BASE_DIR) / "static" / "vendor" / "plotly" / "plotly-cartesian.min.js"


def _version(script: Path) -> str:
    found = re.search(r"plotly\.js (?:\([^)]*\) )?v(\d+\.\d+\.\d+)", script.read_text()[:300])
    assert found, f"no version in the head of {script}"
    return found.group(1)


def test_the_bundle_is_the_plotly_js_that_the_figures_are_built_for() -> None:
    full = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    assert _version(BUNDLE) == _version(full)
    assert BUNDLE.stat().st_size < full.stat().st_size / 3


def test_the_bundle_draws_every_trace_type_our_charts_use() -> None:
    charts = Path(settings.BASE_DIR) / "infraops" / "feedback" / "charts.py"
    used = set(re.findall(r"go\.([A-Z][a-z]+)\(", charts.read_text())) - {"Figure"}
    assert used, "charts.py builds no trace?"
    head = BUNDLE.read_text()
    for trace in used:  # each trace module registers its name as moduleType "trace"
        assert f'name:"{trace.lower()}"' in head, trace


def test_the_pages_with_charts_load_the_bundle_and_no_other_plotly() -> None:
    templates = Path(settings.BASE_DIR) / "templates"
    pages = [p for p in templates.rglob("*.html") if "plotly" in p.read_text()]
    assert {p.name for p in pages} == {"experiment.html", "change.html"}
    for page in pages:
        text = page.read_text()
        assert "vendor/plotly/plotly-cartesian.min.js" in text and "plotly.min.js" not in text


def test_an_uncollected_file_keeps_its_plain_name(settings: Any, tmp_path: Path) -> None:
    settings.STATIC_ROOT = tmp_path / "empty"
    assert HashedStaticFiles().url("img/favicon.svg") == "/static/img/favicon.svg"


def test_the_suite_never_reads_the_installations_collected_files() -> None:
    """`standalone` collects into the checkout's data folder; the README's test command run
    after it in the same checkout must not take that manifest's hashed names (the in-process
    test server serves the plain ones), or the browser tests see pages without styles."""
    root = Path(settings.STATIC_ROOT).resolve()
    for installation in (Path(settings.BASE_DIR) / ".infraops", Path(settings.DATA_DIR)):
        assert not root.is_relative_to(installation.resolve())
    assert static("css/infraops.css") == "/static/css/infraops.css"


@pytest.fixture
def collected(settings: Any, tmp_path: Path) -> Path:
    settings.STATIC_ROOT = tmp_path / "staticfiles"
    call_command("collectstatic", interactive=False, verbosity=0)
    return Path(settings.STATIC_ROOT)


def test_collected_files_have_hashed_names_and_gzip_copies(collected: Path) -> None:
    url = static("vendor/plotly/plotly-cartesian.min.js")
    assert re.fullmatch(r"/static/vendor/plotly/plotly-cartesian\.min\.[0-9a-f]{12}\.js", url)
    hashed = collected / url.removeprefix("/static/")
    assert hashed.read_bytes() == BUNDLE.read_bytes()
    packed = hashed.with_name(hashed.name + ".gz")
    assert gzip.decompress(packed.read_bytes()) == BUNDLE.read_bytes()
    assert packed.stat().st_size < 600_000


def test_whitenoise_serves_them_compressed_and_cached_for_good(collected: Path) -> None:
    serve = WhiteNoiseMiddleware(lambda request: HttpResponse(status=404))
    url = static("vendor/plotly/plotly-cartesian.min.js")
    response: Any = serve(RequestFactory().get(url, HTTP_ACCEPT_ENCODING="gzip, br"))
    assert response.status_code == 200
    assert response["Content-Encoding"] == "gzip"
    assert int(response["Content-Length"]) < 600_000
    assert "immutable" in response["Cache-Control"] and "max-age=315360000" in \
        response["Cache-Control"]
