"""Benchmark of the interactive dashboard on Postgres: a study of 5,000 trials x 200 evaluations
x 3 metrics (3,000,000 metric points), served by a real server process; then

1. every JSON data endpoint of the study page, timed over HTTP (first call, then the median of
   several); target < 300 ms each;
2. the study page in headless Chromium (Debian's chromium + chromium-driver, through Selenium):
   milliseconds from navigation start until every chart has drawn (`data-charts-ready-at`), the
   longest main-thread task while it loads (Long Tasks API), and the curves view redrawn with
   1,000 trials' curves; target (docs/dashboard.md, "Large studies (bench/dashboard_bench.py)"):
   the first visit on a fresh server < 2 s at 5,000 trials, < 3 s at 50,000 trials, no main-thread
   task over 1 s; the summary prints each verdict and the JSON sizes of the history and axis charts.

    .venv/bin/python bench/dashboard_bench.py [--trials 5000] [--evals 200] [--url postgresql+psycopg://...]
    .venv/bin/python bench/dashboard_bench.py --trials 50000 --evals 20

The study is written with bench/analysis_bench.py's set-based SQL into a scratch database that
is dropped afterwards."""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from analysis_bench import build_study  # noqa: E402

from hpo.server.analysis.keeper import keep_all  # noqa: E402
from hpo.server.cache.kept import StillStudies  # noqa: E402
from hpo.server.dashboard.charts.service import first_visit_answer  # noqa: E402
from hpo.server.db import Database  # noqa: E402

KINDS = ("progress", "history", "axis", "parallel", "contour", "importance", "curves", "grad_norm", "isolation",
         "best_steps", "budget", "timeline")  # fmt: skip
_ADAM_LR = quote("learning_rate (optimizer=adam)")  # a learning rate per optimizer: one column per arm
LONGEST_TASK_MS = 1000  # the target: no main-thread task over 1 s


def ready_target_ms(trials: int) -> float:
    """The target: a 5,000-trial study's first visit in under 2 s, a 50,000-trial one in under 3 s."""
    return 2000.0 if trials <= 5000 else 3000.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(url: str, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HPO_DATABASE_URL": url}
    command = [sys.executable, "-m", "uvicorn", "hpo.server.asgi:app", "--port", str(port), "--log-level", "warning"]
    server = subprocess.Popen(command, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("the server did not start")


def time_endpoints(base: str, study_id: int, repeat: int) -> list[tuple[str, float, float, int]]:
    """(path, first seconds, median seconds, bytes) of every data endpoint the study page calls."""
    best = httpx.get(f"{base}/api/v1/studies/{study_id}", timeout=60).json()["best_trial_id"]
    paths = [f"/api/v1/studies/{study_id}/charts/{k}" for k in KINDS]
    paths += [
        f"/api/v1/studies/{study_id}/table?sort=objective&limit=50",
        f"/api/v1/studies/{study_id}/table?status=completed&param={_ADAM_LR}:0.001:0.1&sort=duration&desc=true",
        f"/api/v1/studies/{study_id}/table?sort=param:{_ADAM_LR}&param=weight_decay::0.001",
        f"/api/v1/studies/{study_id}/table?sort=metric:train/loss",
        f"/api/v1/trials/{best}/curves",
        f"/studies/{study_id}",
        f"/studies/{study_id}/analysis-sections",
        f"/api/v1/studies/{study_id}/analysis",
    ]
    rows = []
    with httpx.Client(base_url=base, timeout=120) as client:
        for path in paths:
            start = time.perf_counter()
            reply = client.get(path)
            first = time.perf_counter() - start
            assert reply.status_code == 200, (path, reply.status_code, reply.text[:300])
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                client.get(path)
                times.append(time.perf_counter() - start)
            rows.append((path, first, statistics.median(times), len(reply.content)))
    return rows


_LONG_TASKS = """
window.__longTasks = [];
try {
  new PerformanceObserver(function (list) {
    list.getEntries().forEach(function (e) { window.__longTasks.push(e.duration); });
  }).observe({ type: "longtask", buffered: true });
} catch (e) {}
"""


def browser(base: str, study_id: int, runs: int) -> dict[str, Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--enable-unsafe-swiftshader", "--window-size=1400,1000"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "chromedriver"), options=options)
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": _LONG_TASKS})
    out: dict[str, Any] = {"ready_ms": [], "dom_ms": [], "longest_task_ms": [], "points": None}
    try:
        for _ in range(runs):
            driver.get(f"{base}/studies/{study_id}")
            try:
                ready = _wait(driver, "return document.body.dataset.chartsReadyAt", 60)
            except TimeoutError:
                state = driver.execute_script(
                    "var o = {body: Object.assign({}, document.body.dataset)};"
                    " document.querySelectorAll('[data-chart]').forEach(function (e) {"
                    " o[e.dataset.chart] = Object.assign({}, e.dataset); }); return o;"
                )
                raise TimeoutError(f"the study page never settled: {state}") from None
            out["ready_ms"].append(float(ready))
            out.setdefault("first_view", []).append(
                driver.execute_script(
                    "return Array.from(document.querySelectorAll('[data-chart][data-rendered]'))"
                    ".map(e => e.dataset.chart).join(' ') || '(none in view)'"
                )
            )
            out["dom_ms"].append(
                driver.execute_script(
                    "var n = performance.getEntriesByType('navigation')[0]; return n.domContentLoadedEventEnd;"
                )
            )
            out["longest_task_ms"].append(max(driver.execute_script("return window.__longTasks") or [0]))
            # scroll to every chart in turn (they draw when they come near the viewport)
            driver.execute_script("window.__longTasks = [];")
            kinds = driver.execute_script(
                "return Array.from(document.querySelectorAll('[data-chart]')).map(e => e.dataset.chart)"
            )
            on_demand = []
            for kind in kinds:
                box = f"document.querySelector('[data-chart=\"{kind}\"]')"
                driver.execute_script(f"{box}.scrollIntoView()")
                if driver.execute_script(f"return {box}.dataset.onDemand"):
                    on_demand.append(kind)
                    continue
                _wait(driver, f"return {box}.dataset.rendered", 60)
            out["scroll_longest_task_ms"] = max(driver.execute_script("return window.__longTasks") or [0])
            for kind in on_demand:  # drawn when the person asks (a button): WebGL start-up without a GPU
                box = f"document.querySelector('[data-chart=\"{kind}\"]')"
                driver.execute_script(f"{box}.querySelector('[data-draw]').click()")
                _wait(driver, f"return {box}.dataset.rendered", 120)
            out["on_demand"] = on_demand
            out["points"] = driver.execute_script(
                "var o = {}; document.querySelectorAll('[data-chart]').forEach(function (e) {"
                " o[e.dataset.chart] = e.dataset.points; }); return o;"
            )
            out["draw_ms"] = driver.execute_script(
                "var o = {}; document.querySelectorAll('[data-chart]').forEach(function (e) {"
                " o[e.dataset.chart] = Number(e.dataset.drawMs || 0); }); return o;"
            )
        # the curves view with 1,000 trials: redraw, timing the draw and the longest task meanwhile
        out["curves_ms"] = driver.execute_async_script(
            """
            var done = arguments[arguments.length - 1];
            var box = document.querySelector('[data-chart="curves"]');
            var input = box.parentElement.querySelector('[data-curves="limit"]');
            window.__longTasks = [];
            var t0 = performance.now();
            delete box.dataset.points;
            input.value = "1000";
            input.dispatchEvent(new Event("change"));
            (function wait() {
              var longest = Math.max.apply(null, [0].concat(window.__longTasks));
              if (box.dataset.points) done([performance.now() - t0, longest,
                                            Number(box.dataset.points)]);
              else setTimeout(wait, 20);
            })();
            """
        )
    finally:
        driver.quit()
    return out


def _wait(driver: Any, script: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = driver.execute_script(script)
        if value:
            return value
        time.sleep(0.5)
    raise TimeoutError(script)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1:5432", help="Postgres server URL")
    parser.add_argument("--trials", type=int, default=5000)
    parser.add_argument("--evals", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--browser-runs", type=int, default=3)
    parser.add_argument("--keep", metavar="DATABASE", help="build into (or reuse) this database and keep it")
    parser.add_argument(
        "--unkept",
        action="store_true",
        help="nothing kept (a study no server saw complete): the first visit aggregates every point",
    )
    args = parser.parse_args()
    name = args.keep or f"hpo_dash_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(f"{args.url}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).scalar()
        if not exists:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = f"{args.url}/{name}"
    server = None
    try:
        db = Database(url)
        db.upgrade()
        start = time.perf_counter()
        with db.engine.connect() as conn:
            study_id = conn.execute(text("SELECT min(id) FROM studies")).scalar()
        if study_id is None:
            study_id = build_study(db, args.trials, args.evals)
        print(
            f"study of {args.trials} trials x {args.evals} evaluations x 3 metrics ready"
            f" in {time.perf_counter() - start:.0f} s"
        )
        with db.engine.begin() as conn:
            conn.execute(text("DELETE FROM curve_stats"))
            conn.execute(text("DELETE FROM curve_sketches"))
            conn.execute(text("DELETE FROM kept_charts"))
        if not args.unkept:
            # What a running server's keeper thread (analysis.keeper) does as trials complete.
            start = time.perf_counter()
            kept, took = keep_all(db), time.perf_counter() - start
            print(f"curve statistics and sketches of {kept} completed trials kept (analysis.keeper) in {took:.1f} s")
            # Then, the study being still, its first-screen charts and analysis (the keeper's chore, kept_charts).
            start = time.perf_counter()
            still, took = StillStudies(db, first_visit_answer)(), time.perf_counter() - start
            print(f"first-screen charts and analysis of {still} still study kept (kept_charts) in {took:.1f} s")
        db.dispose()
        # Two fresh server processes, so both halves measure a first visit: nothing computed yet.
        summary: list[str] = []
        if shutil.which("chromium") and shutil.which("chromedriver"):
            port = free_port()
            server = start_server(url, port)
            b = browser(f"http://127.0.0.1:{port}", study_id, args.browser_runs)
            server.terminate()
            server.wait(10)
            print(f"\nstudy page in headless Chromium ({args.browser_runs} loads, the first on a fresh server):")
            print(f"  DOMContentLoaded        {', '.join(f'{v:.0f}' for v in b['dom_ms'])} ms")
            ready = ", ".join(f"{v:.0f}" for v in b["ready_ms"])
            print(f"  charts in view drawn    {ready} ms (target < {ready_target_ms(args.trials):.0f})")
            print(f"  charts drawn at first   {b['first_view']}")
            print(f"  longest main-thread task {', '.join(f'{v:.0f}' for v in b['longest_task_ms'])} ms until then")
            print(f"  scrolled through every chart: longest task {b['scroll_longest_task_ms']:.0f} ms")
            print(f"  draw ms per chart       {b['draw_ms']} (on request: {', '.join(b['on_demand']) or '-'})")
            print(f"  points drawn per chart  {b['points']}")
            ms, longest, points = b["curves_ms"]
            print(f"  curves of 1,000 trials redrawn in {ms:.0f} ms ({points} points; longest task {longest:.0f} ms)")
            target, first = ready_target_ms(args.trials), b["ready_ms"][0]
            verdict = "ok" if first < target else "SLOW"
            summary.append(f"first visit, fresh server: charts drawn in {first:.0f} ms (< {target:.0f}): {verdict}")
            worst = max([*b["longest_task_ms"], b["scroll_longest_task_ms"]])
            verdict = "ok" if worst < LONGEST_TASK_MS else "SLOW"
            summary.append(f"longest main-thread task, loading and scrolling: {worst:.0f} ms (< 1000): {verdict}")
            if not args.unkept:
                # The same first visit before the keeper kept the charts (a study that ended seconds ago).
                with create_engine(url).begin() as conn:
                    conn.execute(text("DELETE FROM kept_charts"))
                port = free_port()
                server = start_server(url, port)
                computed = browser(f"http://127.0.0.1:{port}", study_id, 1)["ready_ms"][0]
                server.terminate()
                server.wait(10)
                print(f"  first visit with no chart kept yet: charts drawn in {computed:.0f} ms")
                summary.append(f"first visit, fresh server, no chart kept yet: charts drawn in {computed:.0f} ms")
        else:
            print("\nchromium / chromedriver not installed: browser timings skipped (apt-get install chromium-driver)")
        port = free_port()
        server = start_server(url, port)
        base = f"http://127.0.0.1:{port}"
        print(f"\n{'endpoint (fresh server)':92} {'first ms':>8} {'median ms':>9} {'KiB':>7}  (target < 300 ms)")
        for path, first, median, size in time_endpoints(base, study_id, args.repeat):
            verdict = "ok" if max(first, median) < 0.3 else "SLOW"
            print(f"{path:92} {first * 1000:8.0f} {median * 1000:9.0f} {size / 1024:7.0f}  {verdict}")
            for name in ("charts/history", "charts/axis", "charts/timeline", "analysis-sections", "/analysis"):
                if path.endswith(name):
                    took = f"first {first * 1000:.0f} ms, then {median * 1000:.0f} ms"
                    summary.append(f"{name}: {size / 1024:.0f} KiB, {took}")
        print(f"\nsummary ({args.trials} trials x {args.evals} evaluations x 3 metrics):")
        for line in summary:
            print(f"  {line}")
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        if not args.keep:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
