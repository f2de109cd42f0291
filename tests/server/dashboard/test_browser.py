"""The dashboard in a real headless Chromium (Debian's chromium and chromium-driver, driven by
Selenium): pages load without console errors, charts draw the expected number of points, hover
names the trial, a click opens it, filters narrow the trial table, the live page follows a
running study, and empty studies say so. Screenshots land in HPO_SCREENSHOT_DIR (default: the
test's tmp folder).

One server, one browser and one planted study are shared by the module (about 30 s in all).
Chromium is required in CI (HPO_REQUIRE_POSTGRES=1 or HPO_REQUIRE_BROWSER=1 turn its absence
into a failure); elsewhere these tests skip without it."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hpo.server.db import Database
from hpo.settings import Settings
from tests.conftest import LiveServer
from tests.server.analysis.protocol import analysis, create, run_one, run_pending
from tests.server.analysis.test_planted import spec, valley
from tests.server.bayesian.helpers import bayesian_spec
from tests.server.bayesian.helpers import run_one as run_bayesian
from tests.server.dashboard.test_bayesian_section import MODEL_VIEW, finish_one
from tests.server.dashboard.test_dashboard import planted_study

REQUIRE_BROWSER = os.environ.get("HPO_REQUIRE_BROWSER") == "1" or os.environ.get("HPO_REQUIRE_POSTGRES") == "1"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("dash")
    settings = Settings(database_url=f"sqlite:///{tmp / 'dash.db'}", artifact_root=tmp / "artifacts")
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        study = planted_study(client)
        empty = create(client, spec("nothing-ran", num_trials=3))
        yield {
            "url": server.url,
            "client": client,
            "study": study,
            "empty": empty,
            "database_url": settings.database_url,
        }


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    binary, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:  # pragma: no cover - selenium is a dev dependency
        binary = None
    if binary is None or chromedriver is None:
        message = "Debian's chromium and chromium-driver are not installed (apt-get install -y chromium-driver)"
        if REQUIRE_BROWSER:
            pytest.fail(message + " and CI requires the browser tests")
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--enable-unsafe-swiftshader", "--window-size=1400,2400"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(service=Service(chromedriver), options=options)
    browser.set_page_load_timeout(60)
    yield browser
    browser.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Any, str], None]:
    folder = Path(os.environ.get("HPO_SCREENSHOT_DIR") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)

    def shoot(browser: Any, name: str) -> None:
        height = browser.execute_script("return document.body.scrollHeight")
        browser.set_window_size(1400, min(max(height, 800), 8000))
        assert browser.save_screenshot(str(folder / f"dashboard-{name}.png"))
        browser.set_window_size(1400, 2400)

    return shoot


def wait(browser: Any, script: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = browser.execute_script(script)
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for: {script}")


def errors(browser: Any) -> list[str]:
    """Console errors since the last call (warnings, such as software WebGL's, are not errors)."""
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def draw_every_chart(browser: Any) -> dict[str, dict[str, str]]:
    """Scrolls each chart into view (they draw when seen), asks for the on-request ones, and
    answers every chart's data attributes once all have drawn."""
    kinds = browser.execute_script(
        "return Array.from(document.querySelectorAll('[data-chart]')).map(e => e.dataset.chart)"
    )
    for kind in kinds:
        box = f"document.querySelector('[data-chart=\"{kind}\"]')"
        browser.execute_script(f"{box}.scrollIntoView()")
        if browser.execute_script(f"return {box}.dataset.onDemand"):
            browser.execute_script(f"{box}.querySelector('[data-draw]').click()")
        wait(browser, f"return {box}.dataset.rendered")
    return browser.execute_script(
        "var o = {}; document.querySelectorAll('[data-chart]')"
        ".forEach(e => o[e.dataset.chart] = Object.assign({}, e.dataset));"
        " return o;"
    )


def test_study_page_charts_hover_click_and_filters(site: dict, driver: Any, shots: Callable) -> None:
    study = site["study"]
    driver.get(f"{site['url']}/studies/{study['id']}")
    charts = draw_every_chart(driver)
    assert not [k for k, c in charts.items() if c.get("failed")], charts
    assert {k for k, c in charts.items() if c.get("empty") == "1"} == set(), charts
    shots(driver, "study")
    # 24 completed trials: 24 points in the history and in each axis panel (2 panels)
    history = driver.find_elements("css selector", '[data-chart="history"] .scatterlayer path.point')
    assert len(history) == 24
    assert len(driver.find_elements("css selector", '[data-chart="axis"] .scatterlayer path.point')) == 48
    assert charts["parallel"]["points"] == "24" and charts["isolation"]["points"] == "2"
    assert not driver.find_elements("css selector", '[data-chart="parallel"] p.empty'), "the request note leaves"
    wait(driver, "return document.getElementById('analysis-sections').dataset.loaded === '1'")
    assert "boundary" in driver.find_element("id", "warnings").text
    assert errors(driver) == []

    from selenium.webdriver.common.action_chains import ActionChains

    point = history[5]
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", point)
    ActionChains(driver).move_to_element(point).perform()
    text = wait(driver, "var h = document.querySelector('[data-chart=\"history\"] .hoverlayer .hovertext');"
                        " return h && h.textContent")  # fmt: skip
    trial_id = int(re.match(r"trial (\d+)", text).group(1))  # type: ignore[union-attr]
    assert (
        text.startswith(f"trial {trial_id}")
        and "(no." not in text
        and "learning_rate=" in text
        and "valid/error_rate = " in text
    )
    ActionChains(driver).click(point).perform()
    wait(driver, f"return location.pathname === '/trials/{trial_id}'")
    wait(driver, "return document.body.dataset.chartsReadyAt")
    assert driver.find_elements("css selector", '[data-chart="valid/error_rate"] .scatterlayer .trace')
    shots(driver, "trial")
    assert errors(driver) == []

    # the trial table: 24 rows, narrowed by arm, by a parameter range, then sorted by objective
    driver.get(f"{site['url']}/studies/{study['id']}")
    wait(driver, "return document.body.dataset.tableFiltered === '24'")
    driver.find_element("css selector", '#trial-filters select[name="arm"] option[value=""]')
    driver.execute_script("var s = document.querySelector('#trial-filters select[name=\"arm\"]');"
                          " s.value = 'optimizer=adam'; s.dispatchEvent(new Event('change'));")  # fmt: skip
    wait(driver, "return document.body.dataset.tableFiltered === '12'")
    driver.find_element("css selector", '#trial-filters select[name="param-name"]').send_keys("learning_rate")
    driver.find_element("css selector", '#trial-filters input[name="param-hi"]').send_keys("0.001")
    driver.find_element("css selector", '#trial-filters button[type="submit"]').click()
    narrowed = int(wait(driver, "var n = document.body.dataset.tableFiltered; return n !== '12' && n"))
    assert 0 < narrowed < 12
    rows = driver.find_elements("css selector", "#trial-table tbody tr")
    assert len(rows) == narrowed and all("optimizer=adam" in r.text for r in rows)
    # one column per hyperparameter, sortable: a click on learning_rate orders the rows by it
    header = driver.find_element("css selector", '#trial-table th[data-sort="param:learning_rate"]')
    index = driver.execute_script(
        "return Array.from(arguments[0].parentElement.children).indexOf(arguments[0])", header
    )
    header.click()
    sorted_by = (
        "var th = document.querySelector('#trial-table th.sorted'); return th && th.dataset.sort === arguments[0]"
    )
    wait(driver, sorted_by.replace("arguments[0]", "'param:learning_rate'"))
    column = driver.execute_script(
        "return Array.from(document.querySelectorAll('#trial-table tbody tr'))"
        ".map(r => Number(r.children[arguments[0]].textContent))",
        index,
    )
    assert len(column) == narrowed and column == sorted(column)
    assert not driver.find_elements("css selector", "#trial-table th[data-sort='number']")  # one numbering
    # a second filter row narrows further (several filters at once)
    driver.find_element("css selector", "#trial-filters [data-add-filter]").click()
    second = driver.find_elements("css selector", "#trial-filters .param-filter")[1]
    second.find_element("css selector", 'select[name="param-name"]').send_keys("weight_decay")
    second.find_element("css selector", 'input[name="param-hi"]').send_keys("1e-9")
    driver.find_element("css selector", '#trial-filters button[type="submit"]').click()
    wait(driver, "return document.body.dataset.tableFiltered === '0'")
    shots(driver, "table")
    assert errors(driver) == []


def test_empty_study_and_error_page(site: dict, driver: Any, shots: Callable) -> None:
    driver.get(f"{site['url']}/studies/{site['empty']['id']}")
    charts = draw_every_chart(driver)
    assert all(c.get("empty") == "1" for c in charts.values()), charts
    wait(driver, "return document.getElementById('analysis-sections').dataset.loaded === '1'")
    body = driver.find_element("tag name", "body").text
    assert "No finished trials yet" in body and "nothing to fix" not in body
    assert "Nothing has started yet" in wait(driver, "return document.getElementById('progress-stall').textContent")
    shots(driver, "empty-study")
    assert errors(driver) == []
    driver.get(f"{site['url']}/studies/999999")
    assert "study 999999 not found" in driver.find_element("id", "error-message").text
    assert [e for e in errors(driver) if "404" not in e] == []  # the page's own 404 is the only one
    driver.find_element("link text", "All studies").click()
    wait(driver, "return location.pathname === '/'")
    driver.get(f"{site['url']}/compare?studies={site['study']['id']},{site['empty']['id']}")
    wait(driver, "return document.body.dataset.chartsReadyAt")
    curves = driver.find_elements("css selector", '[data-chart="compare-curves"] .scatterlayer .trace')
    assert len(curves) == 3, "the planted study's 3 best trials; the empty one has none"
    assert "nothing-ran" in driver.find_element("id", "compare").text
    assert errors(driver) == []
    driver.get(f"{site['url']}/docs")
    wait(driver, "return document.querySelector('.swagger-ui .info') !== null")  # rendered offline
    shots(driver, "api-docs")


def test_live_page_follows_a_running_study(site: dict, driver: Any) -> None:
    client = site["client"]
    assert client.patch(f"/api/v1/studies/{site['empty']['id']}", json={"status": "paused"}).status_code == 200
    study = create(client, spec("live", num_trials=2))
    driver.get(f"{site['url']}/studies/{study['id']}")
    wait(driver, "return document.querySelector('[data-count=\"pending\"]').textContent === '2'")
    claim = client.post("/api/v1/workers/claim", json={"worker_id": "w", "resources": {"cpus": 1, "gpus": 0}}).json()
    wait(driver, "return document.querySelector('[data-count=\"running\"]').textContent === '1'", 15)
    assert f"trial {claim['trial_id']}" in driver.find_element("id", "progress-running").text
    run_one(client, claim, valley(0.5))
    run_pending(client, valley(0.5))
    wait(driver, "return document.querySelector('[data-count=\"completed\"]').textContent === '2'", 15)
    # the history chart redraws with both trials, without a reload
    wait(
        driver, "return document.querySelectorAll('[data-chart=\"history\"] .scatterlayer path.point').length === 2", 20
    )
    assert "All trials finished." in driver.find_element("id", "progress-eta").text
    assert analysis(client, study["id"])["trial_counts"]["completed"] == 2
    assert errors(driver) == []


def test_bayesian_section_draws_best_so_far_and_the_model_bands(site: dict, driver: Any, shots: Callable) -> None:
    """The other studies are finished or paused, so the worker claims this one's trials."""
    from hpo.server.models import BayesianState

    assert site["client"].patch(f"/api/v1/studies/{site['empty']['id']}", json={"status": "paused"}).status_code == 200
    study_id = create(site["client"], bayesian_spec("bo-view", num_trials=2, initial_trials=2))["id"]
    db = Database(site["database_url"])
    finish_one(db)
    with db.transaction() as session:  # as the refiller would store it after a fit (none here: all quasi-random)
        session.get(BayesianState, study_id).model_view = MODEL_VIEW
    finish_one(db)
    assert run_bayesian(db) is None
    db.dispose()
    driver.get(f"{site['url']}/studies/{study_id}")
    wait(driver, "return document.getElementById('analysis-sections').dataset.loaded === '1'")
    best = '[data-bayes="best"]'
    wait(driver, f"return document.querySelector('{best}').dataset.rendered")
    points = driver.find_elements("css selector", f"{best} .scatterlayer .trace:first-child path.point")
    assert len(points) == 2
    from selenium.webdriver.common.action_chains import ActionChains

    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", points[0])
    ActionChains(driver).move_to_element(points[0]).perform()
    text = wait(driver, f"var h = document.querySelector('{best} .hoverlayer .hovertext'); return h && h.textContent")
    assert re.match(r"trial \d+ \(no\. 0, initial\)", text), text  # the point or the best-so-far line's step
    wait(driver, "return document.querySelector('[data-bayes=\"model\"]').dataset.rendered")
    panels = driver.find_elements("css selector", '[data-bayes="model"] .plot.panel')
    assert [p.get_attribute("data-slice") for p in panels] == ["learning_rate", "weight_decay"]
    assert driver.execute_script(
        "return Array.from(document.querySelectorAll('[data-bayes=\"model\"] .plot.panel'))"
        ".map(d => d._fullLayout.xaxis.type + ':' + d.data.length)"
    ) == ["log:3", "log:3"]
    shots(driver, "bayesian")
    assert errors(driver) == []


def test_controls_answer_in_place_and_a_note_never_runs_script(site: dict, driver: Any) -> None:
    """The dashboard's controls and notes (docs/dashboard.md, "Pages"): the arm table's Replicate
    control creates replicas and says so without a reload; a `<script>` in a note is shown as text
    and never runs; a note saved from the page shows when."""
    client, sid = site["client"], site["study"]["id"]
    body = "**bold** <script>window.pwned = 1</script> <img src=x onerror='window.pwned = 2'>"
    assert client.put(f"/api/v1/studies/{sid}/note", json={"body": body}).status_code == 200
    driver.get(f"{site['url']}/studies/{sid}")
    wait(driver, "return document.getElementById('analysis-sections').dataset.loaded === '1'")
    assert driver.execute_script("return document.querySelector('.note-view strong').textContent") == "bold"
    assert driver.execute_script("return window.pwned === undefined")
    before = len(client.get(f"/api/v1/studies/{sid}/trials", params={"limit": 1000}).json()["items"])
    form = "document.querySelector('#arms form.action')"
    driver.execute_script(
        f"{form}.querySelector('input[name=count]').value = 2; {form}.querySelector('button').click()"
    )
    text = wait(
        driver, f"var f = {form}; return f.dataset.answered === '1' && f.querySelector('.action-result').textContent"
    )
    assert text.startswith("created trials ")
    after = client.get(f"/api/v1/studies/{sid}/trials", params={"limit": 1000}).json()["items"]
    assert len(after) == before + 2 and all(int(i) in {t["id"] for t in after} for i in re.findall(r"\d+", text))
    assert driver.execute_script("return window.pwned === undefined") and not errors(driver)

    # a trial's first note, saved from its page, shows at once with when it was saved (no token
    # here: no author's name)
    tid = client.get(f"/api/v1/studies/{sid}/trials", params={"limit": 1}).json()["items"][0]["id"]
    driver.get(f"{site['url']}/trials/{tid}")
    assert driver.execute_script("return document.querySelector('.note-saved').textContent") == ""
    driver.execute_script(
        "var box = document.getElementById('note'); box.querySelector('textarea').value = '*saved* here';"
        " box.querySelector('.save-note').click()"
    )
    saved = wait(driver, "var s = document.querySelector('.note-saved').textContent; return s.length > 0 && s")
    stored = client.get(f"/api/v1/trials/{tid}/note").json()
    assert stored["body"] == "*saved* here" and stored["author"] is None
    assert saved == f"saved {stored['updated_at'][:16].replace('T', ' ')} UTC"
    assert driver.execute_script("return document.querySelector('.note-view em').textContent") == "saved"
    assert not errors(driver)


def test_timeline_draws_each_attempt_with_how_it_ended(driver: Any, tmp_path: Path) -> None:
    """The timeline chart (docs/dashboard.md, "Charts"): a trial preempted on one worker and
    completed on another is two bars, on two rows, in the preempted and completed traces, and the
    caption counts the preemption. Its own server: a claim takes the oldest pending trial of any
    study."""
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'attempts.db'}", artifact_root=tmp_path / "artifacts")
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        study = create(client, spec("attempts", num_trials=2))
        offer = {"cpus": 64, "gpus": 8}
        first = client.post("/api/v1/workers/claim", json={"worker_id": "spot-1", "resources": offer}).json()
        body = {"lease_id": first["lease_id"], "kind": "preempted", "reason": "reclaimed"}
        assert client.post(f"/api/v1/trials/{first['trial_id']}/fail", json=body).status_code == 200
        second = client.post("/api/v1/workers/claim", json={"worker_id": "spot-2", "resources": offer}).json()
        assert second["trial_id"] == first["trial_id"] and second["attempt"] == 2
        done = client.post(f"/api/v1/trials/{second['trial_id']}/complete", json={"lease_id": second["lease_id"]})
        assert done.status_code == 200
        driver.get(f"{server.url}/studies/{study['id']}")
        box = "document.querySelector('[data-chart=\"timeline\"]')"
        driver.execute_script(f"{box}.scrollIntoView()")
        wait(driver, f"return {box}.dataset.rendered")
        traces = driver.execute_script(f"return {box}.data.map(t => [t.name, t.y.filter(y => y !== null)])")
        assert {name: set(rows) for name, rows in traces} == {"preempted": {"spot-1"}, "completed": {"spot-2"}}
        caption = driver.execute_script("return document.querySelector('[data-timeline-note]').textContent")
        assert caption.startswith("2 workers, 2 attempts of 1 trial, ") and caption.endswith(", 1 preempted")
        assert not errors(driver)


def test_axis_panels_below_the_view_draw_when_scrolled_near(site: dict, driver: Any) -> None:
    """A chart of several panels draws the panels near the view and the others as they come near
    (a 5,000-trial study's five axis panels were 0.9 s of its first visit)."""
    driver.set_window_size(700, 600)  # one panel a row
    try:
        driver.get(f"{site['url']}/studies/{site['study']['id']}")
        wait(driver, "return document.body.dataset.chartsReadyAt")
        box = "document.querySelector('[data-chart=\"axis\"]')"
        # The chart's top 100 px below the view: inside the 200 px margin, its second panel not.
        # Scrolled there again at every look until it has drawn: the charts above it that this
        # scroll brings near draw meanwhile and change their heights, which could carry the chart
        # out of the margin before its observer fires, or its second panel into it.
        wait(
            driver,
            f"var r = {box}.getBoundingClientRect();"
            f" window.scrollTo(0, window.scrollY + r.top - innerHeight - 100);"
            f" return {box}.dataset.rendered",
        )
        drawn = f"return Array.from({box}.querySelectorAll('.panel')).map(p => p.dataset.drawn || '')"
        assert driver.execute_script(drawn) == ["1", ""]
        assert driver.execute_script(f"return {box}.dataset.points") == "48"  # what the two panels draw
        driver.execute_script(f"{box}.querySelectorAll('.panel')[1].scrollIntoView()")
        wait(driver, f"return {box}.querySelectorAll('.panel')[1].dataset.drawn === '1'")
        wait(driver, f"return {box}.querySelectorAll('.scatterlayer path.point').length === 48")
        assert errors(driver) == []
    finally:
        driver.set_window_size(1400, 2400)


def test_a_thinned_contour_says_how_many_of_its_trials_it_draws(
    site: dict, driver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past CONTOUR_POINTS trials the contour draws the best and an even sample of them over the
    surface of them all, and its caption says so (the server runs in this process)."""
    from hpo.server.cache import memo
    from hpo.server.dashboard.charts import contour

    monkeypatch.setattr(contour, "CONTOUR_POINTS", 5)
    try:
        # The answers are kept per study version, and the previous test's page may still have had
        # the contour computed unthinned: forget them until the kept answer is the thinned one.
        deadline = time.monotonic() + 30
        while True:
            memo.clear()
            answer = site["client"].get(f"/api/v1/studies/{site['study']['id']}/charts/contour").json()
            if answer["shown"] == 5:
                break
            assert time.monotonic() < deadline, answer["shown"]
            time.sleep(0.2)
        driver.get(f"{site['url']}/studies/{site['study']['id']}")
        box = "document.querySelector('[data-chart=\"contour\"]')"
        driver.execute_script(f"{box}.scrollIntoView()")
        wait(driver, f"return {box}.dataset.rendered")
        caption = driver.execute_script(f"return {box}.parentElement.querySelector('figcaption .thinned').textContent")
        assert re.search(r"\b5 of (\d+) points drawn", caption), caption
        assert int(re.search(r"of (\d+)", caption).group(1)) > 5  # type: ignore[union-attr]
        assert len(driver.find_elements("css selector", '[data-chart="contour"] .scatterlayer path.point')) == 5
        assert driver.find_elements("css selector", '[data-chart="contour"] .contourlayer path')  # the surface
        assert errors(driver) == []
    finally:
        monkeypatch.undo()
        memo.clear()  # the module's other tests see the whole contour again


def _segments(driver: Any, box: str) -> dict[str, list[tuple[str, float, float]]]:
    """The timeline's drawn bars by trace: (row, start ms, end ms), read from Plotly's own data."""
    traces = driver.execute_script(f"return {box}.data.map(t => [t.name, t.mode, t.x, t.y])")
    out: dict[str, list[tuple[str, float, float]]] = {}
    for name, mode, xs, ys in traces:
        if mode != "lines":
            continue
        out[name] = [(ys[i], xs[i], xs[i + 1]) for i in range(0, len(xs), 3)]
    return out


def test_a_timeline_of_sub_pixel_attempts_merges_them_and_unmerges_on_zoom(driver: Any, tmp_path: Path) -> None:
    """Past the threshold (10,000 bars; 1 here through the box's data-merge-from), attempts of one
    outcome on one row less than a pixel apart are one segment that covers each of them, and zooming
    in draws them apart again. Its own server; the attempts are planted 9 s long, 1 s apart, the
    last a day later (so one pixel is over a minute)."""
    from datetime import datetime, timedelta, timezone

    from sqlalchemy import create_engine, text

    settings = Settings(database_url=f"sqlite:///{tmp_path / 'merge.db'}", artifact_root=tmp_path / "artifacts")
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        study = create(client, spec("merge", num_trials=6))
        run_pending(client, valley(1.4))
        base = datetime(2026, 11, 27, 12, tzinfo=timezone.utc)
        engine = create_engine(settings.database_url)
        with engine.begin() as conn:
            ids = [r[0] for r in conn.execute(text("SELECT trial_id FROM trial_attempts ORDER BY trial_id"))]
            for k, trial_id in enumerate(ids):
                start = base + timedelta(seconds=10 * k if k < len(ids) - 1 else 86_400)
                stamps = {
                    "s": start.strftime("%Y-%m-%d %H:%M:%S.%f"),
                    "e": (start + timedelta(seconds=9)).strftime("%Y-%m-%d %H:%M:%S.%f"),
                }
                conn.execute(
                    text("UPDATE trial_attempts SET started_at = :s, ended_at = :e WHERE trial_id = :t"),
                    {**stamps, "t": trial_id},
                )
        engine.dispose()
        timeline = client.get(f"/api/v1/studies/{study['id']}/charts/timeline").json()
        bars, names, t0 = timeline["bars"], [w["name"] for w in timeline["workers"]], timeline["t0"]
        assert len(bars["ids"]) == len(ids) > 3 and t0 == base.timestamp() * 1000
        driver.get(f"{server.url}/studies/{study['id']}")
        box = "document.querySelector('[data-chart=\"timeline\"]')"
        driver.execute_script(f"{box}.dataset.mergeFrom = '1'; {box}.scrollIntoView()")
        before = wait(driver, f"return {box}.dataset.rendered && {box}.dataset.merged")
        merged = _segments(driver, box)
        assert list(merged) == ["completed"] and len(merged["completed"]) == 2  # the day's run, the day after
        for i in range(len(bars["ids"])):  # every attempt lies within a segment of its row
            row, start_ms, end_ms = names[bars["worker"][i]], t0 + 1000 * bars["start"][i], t0 + 1000 * bars["end"][i]
            assert any(r == row and s <= start_ms and end_ms <= e for r, s, e in merged["completed"]), i
        texts = driver.execute_script(f"return {box}.data.flatMap(t => t.text || [])")
        assert (
            f"{len(ids) - 1} attempts, trials {ids[0]} to {ids[-2]}" in texts[0] and "zoom in to see each" in texts[0]
        )

        # Zoomed to the first minute, the way a drag answers it (naive UTC date strings): every
        # attempt in view its own bar again.
        def naive(moment: datetime) -> str:
            return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]

        driver.execute_script(
            f"Plotly.relayout({box}, {{'xaxis.range[0]': arguments[0], 'xaxis.range[1]': arguments[1]}})",
            naive(base),
            naive(base + timedelta(seconds=60)),
        )
        wait(driver, f"var m = {box}.dataset.merged; return m && m !== '{before}'")
        assert len(_segments(driver, box)["completed"]) == len(ids)
        driver.execute_script(f"Plotly.relayout({box}, {{'xaxis.autorange': true}})")
        wait(driver, f"return {box}.dataset.merged === '{before}'")
        assert len(_segments(driver, box)["completed"]) == 2
        assert errors(driver) == []
