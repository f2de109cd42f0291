"""Aliases and values from resumed attempts (docs/analysis.md) in a real headless Chromium: a chart
that needs one of hpo's names the study does not have says so in words on the page (the study page's
gradient-norm and training-loss charts, the trial page), a script's aliased names are labelled as
hpo's on the trial page, and a best value from a resumed attempt is marked in the trial table and on
the trial page. Skips without Debian's chromium and chromium-driver, as
tests/server/dashboard/test_browser.py does."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from hpo.policy import ExecutionPolicy
from hpo.settings import Settings
from tests.conftest import LiveServer
from tests.server.analysis import planted
from tests.server.analysis.protocol import API, create, run_pending
from tests.server.analysis.test_planted import spec
from tests.server.analysis.test_planted_aliases import ALIASES, NO_GRAD_NORM, NO_TRAIN_LOSS, plant, script_spec
from tests.server.analysis.test_planted_resumed import claim, run_resumed
from tests.server.dashboard.test_browser import REQUIRE_BROWSER, errors, wait

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]


@pytest.fixture
def browser() -> Iterator[Any]:
    binary, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:  # pragma: no cover - selenium is a dev dependency
        binary = None
    if binary is None or chromedriver is None:
        if REQUIRE_BROWSER:
            pytest.fail("Debian's chromium and chromium-driver are not installed and CI requires the browser tests")
        pytest.skip("Debian's chromium and chromium-driver are not installed (apt-get install -y chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,2400",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def chart_text(driver: Any, kind: str) -> str:
    box = f"document.querySelector('[data-chart=\"{kind}\"]')"
    driver.execute_script(f"{box}.scrollIntoView()")  # charts draw when seen
    wait(driver, f"return {box}.dataset.rendered")
    return str(driver.execute_script(f"return {box}.dataset.empty === '1' && {box}.textContent"))


def test_pages_say_which_name_a_chart_needs(settings: Settings, browser: Any) -> None:
    policy = ExecutionPolicy(command_prefixes=(("{python}", "train.py"),))
    with (
        LiveServer(dataclasses.replace(settings, execution_policy=policy)) as live,
        httpx.Client(base_url=live.url, timeout=30) as client,
    ):
        bare = create(client, script_spec("unaliased-page", None))
        named = create(client, script_spec("aliased-page", ALIASES))
        run_pending(client, plant)
        browser.get(f"{live.url}/studies/{bare['id']}")
        assert chart_text(browser, "grad_norm") == NO_GRAD_NORM
        browser.execute_script(
            "var s = document.querySelector('[data-curves=\"metric\"]'); s.value = 'train/loss';"
            " s.dispatchEvent(new Event('change'));"
        )
        wait(
            browser,
            "var b = document.querySelector('[data-chart=\"curves\"]'); return b.textContent.includes('no metric')",
        )
        assert chart_text(browser, "curves") == NO_TRAIN_LOSS
        assert errors(browser) == []

        first = client.get(f"{API}/studies/{bare['id']}/trials").json()["items"][0]["id"]
        browser.get(f"{live.url}/trials/{first}")
        wait(browser, "return document.querySelectorAll('#trial-missing li').length === 2")
        said = browser.execute_script(
            "return Array.from(document.querySelectorAll('#trial-missing li')).map(l => l.textContent)"
        )
        assert said == [NO_TRAIN_LOSS, NO_GRAD_NORM]

        aliased = client.get(f"{API}/studies/{named['id']}/trials").json()["items"][0]["id"]
        browser.get(f"{live.url}/trials/{aliased}")
        wait(browser, "return document.body.dataset.chartsReadyAt")
        captions = browser.execute_script(
            "return Array.from(document.querySelectorAll('#trial-curves figcaption')).map(c => c.textContent)"
        )
        assert (
            "loss (train/loss in analysis.aliases)" in captions
            and "gnorm (train/grad_norm in analysis.aliases)" in captions
        )
        assert browser.execute_script("return document.querySelectorAll('#trial-missing li').length") == 0
        assert errors(browser) == []

        # a best value from a resumed attempt (docs/analysis.md, "Values from resumed attempts") is
        # marked in the table and on the trial page
        resumed = create(client, spec("resumed-page", num_trials=1))
        first = claim(client)
        valid, train = planted.clean(1, 0.05, noise=0.0005)
        valid = planted.Curve(valid.steps, np.where(valid.steps == planted.HORIZON, 0.04, valid.values))  # best: last
        run_resumed(client, first, valid, train)
        browser.get(f"{live.url}/studies/{resumed['id']}")
        wait(browser, "return document.body.dataset.tableFiltered === '1'")
        badges = browser.execute_script(
            "return Array.from(document.querySelectorAll('#trial-table .badge.resumed')).length"
        )
        assert badges == 1
        browser.get(f"{live.url}/trials/{first['trial_id']}")
        mark = browser.find_element("id", "resumed").text
        assert "resumed from the checkpoint at step 1000" in mark and "The built-in trainer resumes exactly" in mark
        assert errors(browser) == []
