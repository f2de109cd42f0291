"""The study, trial, pipeline and round pages over real HTTP (docs/dashboard.md, "Pages"), on
SQLite and Postgres: navigation, the controls a writer gets, the failure summary, Markdown notes
rendered safely, one status, and the pipeline and round pages with the links to them."""

from __future__ import annotations

import re
from typing import Any

import httpx

from tests.server.analysis.protocol import API, create, run_pending
from tests.server.dashboard.test_conditional_charts import adam_lr_drives, conditional_spec
from tests.server.rounds.test_rounds_api import lr_sweep, make_pipeline, make_round, valley


def page(client: httpx.Client, path: str) -> str:
    reply = client.get(path, headers={"Accept": "text/html"})
    assert reply.status_code == 200, reply.text
    return reply.text


def with_failures(config: dict[str, Any]) -> Any:
    """The conditional study's planted responses; Adam above a learning rate of 0.005 diverges."""
    outcome = adam_lr_drives(config)
    params = config["params"]
    if params["optimizer"] == "adam" and params["learning_rate"] > 0.005:
        outcome.fail, outcome.fail_step = "loss is NaN at step 300", 300
    return outcome


def test_study_page_has_navigation_controls_failures_and_one_status(client: httpx.Client) -> None:
    study = create(client, conditional_spec(num_trials=12))
    run_pending(client, with_failures)
    sid = study["id"]
    analysis = client.get(f"{API}/studies/{sid}/analysis").json()
    assert analysis["infeasible"]["count"] >= 2
    html = page(client, f"/studies/{sid}")
    toc = re.search(r'<nav class="toc" id="toc">(.*?)</nav>', html, re.S)
    assert toc is not None
    anchors = ("summary", "warnings-section", "comparison-section", "failures", "charts", "trials", "space", "note")
    for anchor in anchors:
        assert f'href="#{anchor}"' in toc.group(1)
        assert f'id="{anchor}"' in html or anchor in ("warnings-section", "comparison-section", "failures")
    # the first screen holds a chart beside the progress
    first = html.split('<div class="first-screen">', 1)[1].split('id="actions"', 1)[0]
    assert 'data-chart="history"' in first
    # the study's controls (no authentication configured: every caller may write)
    for url in (f"/api/v1/studies/{sid}/replicas", f"/api/v1/studies/{sid}"):
        assert f'data-url="{url}"' in html
    assert ">Pause</button>" in html and ">Grow</button>" in html and ">Archive</button>" in html
    # one status: the page's badge and the progress poll both say completed
    assert 'id="study-status">completed<' in html
    assert client.get(f"{API}/studies/{sid}/charts/progress").json()["status"] == "completed"

    sections = page(client, f"/studies/{sid}/analysis-sections")
    for arm in analysis["arms"]:
        assert f'data-url="/api/v1/trials/{arm["best_trial_id"]}/replicas"' in sections  # a control per arm
    assert "trial page, &#34;Replicas&#34;" not in sections and "Replicas&#34;)" not in sections
    failures = sections.split('id="failures"', 1)[1].split("</section>", 1)[0]
    assert "loss is NaN at step N" in failures  # the analysis' reasons with their counts
    for tid in analysis["infeasible"]["trial_ids"]:
        assert f'href="/trials/{tid}"' in failures
    if analysis["infeasible"]["where"]:
        assert analysis["infeasible"]["where"]["label"] in failures


def test_notes_render_markdown_and_never_raw_html(client: httpx.Client) -> None:
    study = create(client, conditional_spec(num_trials=2))
    body = "**lr** matters\n\n<script>window.pwned = 1</script>\n\n[x](javascript:alert(1))\n\n- one\n- two"
    saved = client.put(f"{API}/studies/{study['id']}/note", json={"body": body})
    assert saved.status_code == 200 and "<strong>lr</strong>" in saved.json()["html"]
    html = page(client, f"/studies/{study['id']}")
    view = html.split('class="note-view markdown">', 1)[1].split("</div>", 1)[0]
    assert "<strong>lr</strong>" in view and "<li>one</li>" in view
    assert "<script>" not in view and "&lt;script&gt;" in view and 'href="javascript:' not in view
    preview = client.post(f"{API}/notes/preview", json={"body": "# Title <img src=x onerror=alert(1)>"})
    assert preview.status_code == 200 and preview.json()["html"].startswith("<h1>Title &lt;img")
    too_long = client.post(f"{API}/notes/preview", json={"body": "x" * 20_001})
    assert too_long.status_code == 422


def test_trial_page_controls_and_one_failure_line(client: httpx.Client) -> None:
    study = create(client, conditional_spec(num_trials=4))
    run_pending(client, with_failures)
    trials = client.get(f"{API}/studies/{study['id']}/trials", params={"limit": 100}).json()["items"]
    bad = next(t for t in trials if t["status"] == "infeasible")
    html = page(client, f"/trials/{bad['id']}")
    failure = re.search(r'<p class="error" id="failure">(.*?)</p>', html, re.S)
    assert failure is not None
    assert failure.group(1).count("infeasible") == 1 and failure.group(1).count("step 300") == 1
    assert f'data-url="/api/v1/trials/{bad["id"]}/replicas"' in html
    assert f"/api/v1/trials/{bad['id']}/retry" not in html  # only a failed trial can be retried


def test_pipeline_and_round_pages_and_their_links(client: httpx.Client) -> None:
    pipeline = make_pipeline(client, "pages")
    rnd = make_round(client, pipeline["id"], goal="tune the learning rate")
    study = create(client, lr_sweep(rnd["id"], num_trials=6))
    run_pending(client, valley)
    made = client.post(f"{API}/rounds/{rnd['id']}/replicas", json={"count": 3})
    assert made.status_code == 201, made.text
    run_pending(client, valley)

    index = page(client, "/")
    assert f'href="/pipelines/{pipeline["id"]}"' in index
    study_html = page(client, f"/studies/{study['id']}")
    assert f'href="/rounds/{rnd["id"]}"' in study_html and f'href="/pipelines/{pipeline["id"]}"' in study_html

    line = page(client, f"/pipelines/{pipeline['id']}")
    assert 'data-chart="launches"' in line and f'href="/rounds/{rnd["id"]}"' in line
    assert "tune the learning rate" in line and "learning_rate" in line.split('id="baseline-params"', 1)[1]
    shown = page(client, f"/rounds/{rnd['id']}")
    answer = client.get(f"{API}/rounds/{rnd['id']}").json()
    assert answer["evidence"]["verdict"] in shown and 'data-chart="evidence"' in shown
    assert f'href="/trials/{answer["candidate"]["trial_id"]}"' in shown
    assert f'href="/studies/{study["id"]}"' in shown

    decided = client.post(
        f"{API}/rounds/{rnd['id']}/decision", json={"adopt": True, "note": "better", "override": True}
    )
    assert decided.status_code == 200, decided.text
    line = page(client, f"/pipelines/{pipeline['id']}")
    launches = line.split('id="launch-table"', 1)[1].split("</table>", 1)[0]
    assert f'href="/trials/{answer["candidate"]["trial_id"]}"' in launches and "→" in launches
    assert "adopted" in line.split('id="round-table"', 1)[1]

    for path in ("/pipelines/999999", "/rounds/999999"):
        assert client.get(path, headers={"Accept": "text/html"}).status_code == 404


def test_the_study_page_starts_the_judgement_its_charts_start_from(client: httpx.Client) -> None:
    """Once the study page has answered, the trial summaries every chart starts from are being
    computed (charts.warm), so the charts the page asks for next do not each wait for them."""
    import time

    from hpo.server.cache import memo

    study = create(client, conditional_spec(num_trials=10))
    run_pending(client, with_failures)
    memo.clear()
    page(client, f"/studies/{study['id']}")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if any(key[1] == study["id"] and key[2][0] == "load_trials" for key in list(memo._ENTRIES)):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the study page did not start the trial summaries")
    assert client.get(f"{API}/studies/{study['id']}/charts/history").status_code == 200


def test_a_study_s_charts_asked_at_once_answer_as_one_by_one(client: httpx.Client) -> None:
    """A study's charts are computed one at a time (charts._computed) while the page's warm-up
    runs beside them: asked for at once, as the page does, every one answers, and as when asked
    one by one."""
    from concurrent.futures import ThreadPoolExecutor

    from hpo.server.cache import memo

    study = create(client, conditional_spec(num_trials=12))
    run_pending(client, with_failures)
    kinds = ["history", "axis", "isolation", "importance", "best_steps", "budget"]
    paths = [f"{API}/studies/{study['id']}/charts/{kind}" for kind in kinds]
    one_by_one = [client.get(path).json() for path in paths]
    memo.clear()
    with ThreadPoolExecutor(len(paths) + 1) as pool:
        page_done = pool.submit(page, client, f"/studies/{study['id']}")
        answers = list(pool.map(lambda path: client.get(path), paths))
        page_done.result()
    assert [a.status_code for a in answers] == [200] * len(paths)
    assert [a.json() for a in answers] == one_by_one
