"""Text from a job's record shows as text on the console's pages, whatever markup it holds:
a trainer's error message, labels, replica names, a tuning job's metric tag, parameters
and values, a batch prediction's output path. Each field is given text that, read as HTML,
would add an element marked `data-injected` and hide `<step 40>`; the pages are checked in
Chromium (as served, and after the job page's own refresh of its live part) and as raw
HTML."""
from __future__ import annotations

import urllib.request
from html import escape

import pytest

from submit import jobs as records
from tests.support.browser import chromium, skip_reason, start_console

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


def mark(field: str) -> str:
    return f"{field}: <b data-injected>bold</b> at <step 40> & after"


def marked_job() -> records.JobRecord:
    """A failed tuning job whose every shown text field holds markup."""
    param, value = mark("param"), mark("value")
    record = records.JobRecord(
        job_id="markup01", state=records.FAILED, runner="local",
        error_message=mark("error"), labels={"team": mark("label")},
        replicas=[records.ReplicaRecord(mark("replica"), state="EXITED", exit_code=1)],
        training_input={"hyperparameters": {
            "goal": "MAXIMIZE", "hyperparameterMetricTag": mark("tag"),
            "params": [{"parameterName": param, "type": "CATEGORICAL",
                        "categoricalValues": [value]}]}},
        training_output={"trials": [{"trialId": "1", "state": "SUCCEEDED",
                                     "finalMetric": {"objectiveValue": 0.5,
                                                     "trainingStep": "3"},
                                     "hyperparameters": {param: value}}]},
        prediction_output={"outputPath": mark("path")})
    records.save(record)
    return record


def test_markup_in_a_jobs_fields_shows_as_text(tmp_path, reaper):
    marked_job()
    url = start_console(reaper, tmp_path / "console.log")
    with chromium(tmp_path / "profile") as page:
        page.goto(f"{url}/jobs/markup01")
        shown = {
            "error": "#live .error",
            "replica": "#replicas tbody td >> nth=0",
            "replica picker": "#task option >> nth=1",
            "tag": "#trials-table thead th >> nth=2",
            "param": "#trials-table thead th >> nth=4",
            "value": "#trials-table tbody td >> nth=4",
            "path": "#prediction td >> nth=-1",
        }

        def check(when):
            assert page.locator("[data-injected]").count() == 0, when
            for name, selector in shown.items():
                field = name.split()[0]
                assert page.locator(selector).text_content() == mark(field), (when, name)
            assert page.locator("svg.per-parameter").get_attribute("aria-label") == \
                f"{mark('tag')} per {mark('param')}"

        check("as served")
        # the page replaces its live part with /live's HTML (innerHTML) every 2 s
        page.evaluate("document.getElementById('state').dataset.served = '1'")
        page.wait_for_function("() => !document.getElementById('state').dataset.served",
                               timeout=30_000)
        check("refreshed")
        page.goto(url + "/")
        row = page.locator('#jobs tr[data-job="markup01"] td')
        assert row.nth(2).text_content() == f"team={mark('label')}"
        assert page.locator("[data-injected]").count() == 0
    # the HTML as served: escaped, never markup
    for path in ("/jobs/markup01", "/jobs/markup01/live", "/"):
        with urllib.request.urlopen(url + path, timeout=30) as answer:
            html = answer.read().decode()
        assert "<b data-injected>" not in html and "<step 40>" not in html, path
    with urllib.request.urlopen(f"{url}/jobs/markup01/live", timeout=30) as answer:
        assert f"<p class=error role=alert>{escape(mark('error'))}</p>" in answer.read().decode()
