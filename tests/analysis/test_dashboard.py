"""The dashboard: pages over HTTP on SQLite and Postgres, then in headless Chromium (Debian's
`chromium`) with screenshots and a check that every plot image rendered.

Chromium is required in CI (HPO_REQUIRE_POSTGRES=1 or HPO_REQUIRE_BROWSER=1 make its absence a
failure); elsewhere the browser test skips without it. Screenshots land in the test's tmp folder,
or in HPO_SCREENSHOT_DIR when set."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from matplotlib import image

from hpo.settings import Settings
from tests.analysis.protocol import analysis, create, run_pending
from tests.analysis.test_planted import spec, valley
from tests.conftest import LiveServer

REQUIRE_BROWSER = os.environ.get("HPO_REQUIRE_BROWSER") == "1" or os.environ.get("HPO_REQUIRE_POSTGRES") == "1"


def planted_study(client: httpx.Client) -> dict:
    """A two-arm study whose learning rate optimum lies beyond the range (one boundary warning)."""
    arms = [{"name": "optimizer", "role": "scientific", "type": "categorical", "values": ["sgd", "adam"]}]
    study = create(client, spec("dashboard-demo", num_trials=12, scientific=arms))
    run_pending(client, valley(1.4))
    return study


def test_pages_render_the_tracking_sheet_study_and_trial(client: httpx.Client) -> None:
    study = planted_study(client)
    index = client.get("/")
    assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
    assert f'href="/studies/{study["id"]}"' in index.text and "dashboard-demo" in index.text
    assert "/api/v1/studies.csv" in index.text and "hpo study show" in index.text
    page = client.get(f"/studies/{study['id']}")
    assert page.status_code == 200
    for text in ("Scientific", "Nuisance", "Fixed", "learning_rate", "batch_size", "boundary", "Best trial per arm"):
        assert text in page.text
    assert len(re.findall(r'<img class="plot"', page.text)) == 6
    best = analysis(client, study["id"])["arms"][0]["best_trial_id"]
    trial = client.get(f"/trials/{best}")
    assert trial.status_code == 200 and "learning_rate" in trial.text and "Checkpoints" in trial.text
    assert f"plots/curves?format=svg&amp;trial_id={best}" in trial.text
    assert client.get("/static/dashboard.css").headers["content-type"].startswith("text/css")


def test_unknown_pages_and_static_files(client: httpx.Client) -> None:
    assert client.get("/studies/999999").status_code == 404
    assert client.get("/trials/999999").status_code == 404
    assert client.get("/static/missing.css").status_code == 404
    assert client.get("/static/..%2Fapp.py").status_code == 404
    assert "No studies yet" in client.get("/").text


# --- headless Chromium -------------------------------------------------------------------------


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[list[str]]:
    binary = _chromium()
    if binary is None:
        message = "Debian's chromium is not installed (apt-get install -y chromium)"
        if REQUIRE_BROWSER:
            pytest.fail(message + " and CI requires the browser test")
        pytest.skip(message)
    profile = tmp_path / "chromium-profile"
    yield [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=20000",
    ]


@pytest.fixture
def sqlite_server(tmp_path: Path) -> Iterator[LiveServer]:
    """One backend is enough for the browser (the pages are the same on both)."""
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'dash.db'}", artifact_root=tmp_path / "artifacts")
    with LiveServer(settings) as server:
        yield server


def _visit(browser: list[str], url: str, path: Path) -> tuple[str, np.ndarray]:
    """Loads the page once: its DOM after the scripts ran, and a screenshot's pixels."""
    args = [*browser, "--dump-dom", f"--screenshot={path}", "--window-size=1400,2600", url]
    done = subprocess.run(args, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0 and path.exists(), done.stderr[-2000:]
    target = os.environ.get("HPO_SCREENSHOT_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / path.name)
    return done.stdout, image.imread(str(path))


def _colors(pixels: np.ndarray) -> int:
    """How many distinct colours a screenshot holds (a blank page has a handful)."""
    rgb = (pixels[..., :3] * 255).astype(np.uint32)
    return len(np.unique((rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]))


def _plots_loaded(dom: str) -> tuple[int, int]:
    loaded = re.search(r'data-plots-loaded="(\d+)"', dom)
    total = re.search(r'data-plots-total="(\d+)"', dom)
    assert loaded and total, "the page's script did not report on its plots"
    return int(loaded.group(1)), int(total.group(1))


def test_dashboard_in_headless_chromium(browser: list[str], sqlite_server: LiveServer, tmp_path: Path) -> None:
    with httpx.Client(base_url=sqlite_server.url, timeout=30) as client:
        study = planted_study(client)
        best = analysis(client, study["id"])["arms"][0]["best_trial_id"]
    base = sqlite_server.url
    pages = {"index": f"{base}/", "study": f"{base}/studies/{study['id']}", "trial": f"{base}/trials/{best}"}
    seen = {name: _visit(browser, url, tmp_path / f"dashboard-{name}.png") for name, url in pages.items()}
    for name, (_, pixels) in seen.items():
        assert pixels.shape[0] > 500 and pixels.shape[1] >= 1400
        assert _colors(pixels) > 50, f"{name} screenshot looks blank"
    index, study_page, trial_page = (seen[name][0] for name in ("index", "study", "trial"))
    assert "dashboard-demo" in index and f"/studies/{study['id']}" in index
    assert _plots_loaded(study_page) == (6, 6), "every plot on the study page must render"
    assert "boundary" in study_page
    assert _plots_loaded(trial_page) == (2, 2)
