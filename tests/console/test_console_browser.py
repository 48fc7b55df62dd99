"""The console in a real browser (Playwright driving Debian's Chromium) against real jobs:
the bundled trainer's MLP watched to SUCCEEDED with its logs arriving while it runs (slow:
TensorFlow's start); a
cluster cancelled from its page with every process checked dead by PID; a tuning job's
trials and plots. Screenshots of each page are kept under the test's tmp dir
(MLJOB_DOC_SCREENSHOTS=1 also copies them to docs/images/)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import yaml

from submit import jobs as records
from submit.errors import SubmitError
from tests.support.browser import chromium, screenshot, skip_reason, start_console
from tests.support.common import ROOT, pid_alive
from tests.support.submit_cli import write_package
from tests.support.trainer_runs import SAMPLE

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))

SLOW_TASK = r'''
import json, os, sys, time
task = json.loads(os.environ["TF_CONFIG"])["task"]
for i in range(100000):
    print(f"{task['type']} {task['index']} tick {i}", flush=True)
    time.sleep(0.2)
'''

TUNE_TASK = r'''
import sys
import hypertune  # the real cloudml-hypertune library
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
x = float(args["x"])
for step in (1, 2):
    score = 1.0 - (x - 0.3) ** 2 + (0.1 if args["opt"] == "adam" else 0.0) - 0.1 / step
    hypertune.HyperTune().report_hyperparameter_tuning_metric(
        hyperparameter_metric_tag="score", metric_value=score, global_step=step)
    print(f"step {step} score={score}", flush=True)
'''


def submit_async(*argv, timeout=300):
    out = subprocess.run([sys.executable, "-m", "submit", *argv, "--async"] if "--" not in
                         argv else [sys.executable, "-m", "submit",
                                    *argv[:argv.index("--")], "--async",
                                    *argv[argv.index("--"):]],
                         cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return records.load(argv[0])


def stop_supervisor(job_id):
    """A supervisor left by a failed test: SIGTERM cancels its job, stopping every replica."""
    try:
        record = records.load(job_id)
    except SubmitError:  # never submitted
        return
    if record.supervisor_alive():
        import signal
        os.kill(record.supervisor_pid, signal.SIGTERM)


@pytest.mark.slow  # TensorFlow's start and 1,500 steps: about 30 s on two idle cores
def test_a_training_job_watched_to_succeeded_with_live_logs(tmp_path, reaper):
    url = start_console(reaper, tmp_path / "console.log")
    record = submit_async("web01", "--job-dir", str(tmp_path / "web01"), "--labels",
                          "team=vision,model=mlp", "--", "--model", "mlp", "--data-dir",
                          SAMPLE, "--train-steps", "1500", "--batch-size", "32",
                          "--log-every", "100", "--seed", "1")
    try:
        with chromium(tmp_path / "profile") as page:
            page.goto(f"{url}/jobs/web01")
            logs = page.locator("#logs")
            # lines arrive while the job still runs: the page did not load them at once
            page.wait_for_function(
                "() => document.getElementById('logs').textContent.includes('step ')"
                " && document.getElementById('state').textContent === 'RUNNING'",
                timeout=300_000)
            seen_running = logs.text_content()
            # the curves, from the chief's summaries while it trains (polled every 5 s)
            page.wait_for_function(
                "() => document.querySelector('#curves tr[data-tag=\"metrics/loss\"]"
                "[data-run=\"train\"]') && document.getElementById('state')"
                ".textContent === 'RUNNING'", timeout=300_000)
            # a row while the job is RUNNING is the live poll (the page fetched it before
            # the end); its step may already be the last one on a loaded machine, where
            # the chief is still exporting and evaluating after step 1,500
            early = int(page.locator('#curves tr[data-tag="metrics/loss"][data-run="train"]'
                                     " td").nth(2).text_content())
            assert 1 <= early <= 1500  # a step the trainer summarised
            page.wait_for_function(
                "() => document.getElementById('state').textContent === 'SUCCEEDED'",
                timeout=300_000)
            page.wait_for_function("() => document.getElementById('logs').dataset.ended",
                                   timeout=60_000)
            text = logs.text_content()
            assert "master-replica-0\tstep 1500/1500 loss=" in text
            assert "training finished" not in seen_running
            assert text.startswith(seen_running)
            assert logs.get_attribute("data-ended") == "SUCCEEDED"
            assert text.count("\tstep 1500/1500 ") == 1  # each line once
            row = page.locator('#replicas tr[data-replica="master-replica-0"] td')
            assert row.all_text_contents()[1:4] == ["EXITED", "0", "0"]
            assert float(row.nth(5).text_content()) > 0   # CPU peak, cores
            assert float(row.nth(7).text_content()) > 100  # memory peak, MiB: TensorFlow
            assert page.locator("svg.cpu .series").count() == 1
            assert page.locator("#cancel").count() == 0  # nothing to cancel any more
            assert page.locator("#tensorboard").text_content() == \
                f"tensorboard --logdir {tmp_path / 'web01'}"
            # the last summaries, read once more when the job ended: train and eval at
            # the last step, the train loss the last progress line printed
            page.wait_for_function("() => document.getElementById('curves').dataset.final",
                                   timeout=60_000)
            last = {(r.get_attribute("data-tag"), r.get_attribute("data-run")):
                    r.locator("td").all_text_contents()[2:]
                    for r in page.locator("#curves-last tbody tr").all()}
            assert last[("metrics/loss", "train")][0] == "1500"
            assert last[("metrics/loss", "eval")][0] == "1500"
            assert ("metrics/accuracy", "eval") in last
            printed = float(text.split("step 1500/1500 loss=")[1].split()[0])
            assert float(last[("metrics/loss", "train")][1]) == pytest.approx(printed,
                                                                              abs=1e-3)
            assert [c.get_attribute("aria-label") for c in
                    page.locator("#curves svg.curve").all()] == ["metrics/loss",
                                                                "metrics/accuracy"]
            screenshot(page, tmp_path, "console-job.png")
            screenshot(page, tmp_path, "console-curves.png", page.locator("#curves-part"))
            # the task picker: one replica's lines only
            page.select_option("#task", "master-replica-0")
            page.wait_for_function("() => document.getElementById('logs').dataset.ended")
            assert all("\tmaster-replica-0\t" in line
                       for line in logs.text_content().splitlines()
                       if not line.startswith("-- "))

            page.goto(url + "/")
            row = page.locator('#jobs tr[data-job="web01"] td')
            assert row.nth(1).text_content() == "SUCCEEDED"
            assert row.nth(2).text_content() == "model=mlp team=vision"
            assert row.nth(5).text_content() == "local"
            screenshot(page, tmp_path, "console-jobs.png")
            page.fill("input[name=filter]", "state=FAILED")
            page.click("form.filter button")
            assert page.locator('#jobs tr[data-job="web01"]').count() == 0
            page.goto(url + "/?filter=labels.team=vision")
            assert page.locator('#jobs tr[data-job="web01"]').count() == 1
            page.goto(url + "/?filter=colour=blue")
            assert "unknown field 'colour'" in page.locator(".error").text_content()
        final = records.load("web01")
        assert final.state == records.SUCCEEDED
        assert final.usage["master-replica-0"]["samples"] >= 2
    finally:
        stop_supervisor(record.job_id)


def test_cancel_from_the_page_stops_every_process(tmp_path, reaper):
    url = start_console(reaper, tmp_path / "console.log")
    config = tmp_path / "custom.yaml"
    config.write_text("trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
                      "  workerCount: 2\n  parameterServerCount: 1\n")
    pkg = write_package(tmp_path / "pkg", SLOW_TASK)
    record = submit_async("web02", "--config", str(config), "--job-dir",
                          str(tmp_path / "web02"), "--package-path", pkg,
                          "--module-name", "fakejob.task")
    try:
        with chromium(tmp_path / "profile") as page:
            page.goto(f"{url}/jobs/web02")
            page.wait_for_function(
                "() => document.getElementById('logs').textContent.includes('ps 0 tick')"
                " && document.getElementById('state').textContent === 'RUNNING'",
                timeout=120_000)
            running = records.load("web02")
            pids = [r.pid for r in running.replicas] + [running.supervisor_pid]
            assert len(pids) == 5 and all(pid_alive(p) for p in pids)
            screenshot(page, tmp_path, "console-running.png")
            page.click("#cancel button")
            page.wait_for_function(
                "() => document.getElementById('state').textContent === 'CANCELLED'",
                timeout=120_000)
            page.wait_for_function("() => document.getElementById('logs').dataset.ended",
                                   timeout=60_000)
            assert page.locator("#logs").get_attribute("data-ended") == "CANCELLED"
            states = page.locator("#replicas tbody tr td:nth-child(2)").all_text_contents()
            assert states == ["STOPPED"] * 4
            screenshot(page, tmp_path, "console-cancelled.png")
        final = records.load("web02")
        assert final.state == records.CANCELLED
        assert [p for p in pids if pid_alive(p)] == []
    finally:
        stop_supervisor(record.job_id)


def test_a_tuning_jobs_trials_and_plots(tmp_path, reaper):
    url = start_console(reaper, tmp_path / "console.log")
    config = tmp_path / "tuning.yaml"
    config.write_text(yaml.safe_dump({"trainingInput": {"hyperparameters": {
        "goal": "MAXIMIZE", "hyperparameterMetricTag": "score", "maxTrials": 4,
        "maxParallelTrials": 2, "params": [
            {"parameterName": "x", "type": "DOUBLE", "minValue": -1.0, "maxValue": 1.0},
            {"parameterName": "opt", "type": "CATEGORICAL",
             "categoricalValues": ["adam", "sgd"]}]}}}))
    pkg = write_package(tmp_path / "pkg", TUNE_TASK)
    out = subprocess.run([sys.executable, "-m", "submit", "tune01", "--config", str(config),
                          "--job-dir", str(tmp_path / "tune01"), "--package-path", pkg,
                          "--module-name", "fakejob.task"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    trials = records.load("tune01").training_output["trials"]
    with chromium(tmp_path / "profile") as page:
        page.goto(f"{url}/jobs/tune01")
        rows = page.locator("#trials-table tbody tr")
        assert rows.count() == 4
        # best first, as the record ranks them, with each trial's parameters
        assert [rows.nth(i).get_attribute("data-trial") for i in range(4)] == \
            [t["trialId"] for t in trials]
        first = rows.nth(0).locator("td").all_text_contents()
        assert first[0] == trials[0]["trialId"] and first[1] == "SUCCEEDED"
        assert float(first[2]) == pytest.approx(trials[0]["finalMetric"]["objectiveValue"],
                                                rel=1e-5)
        assert first[4:] == [trials[0]["hyperparameters"]["x"],
                             trials[0]["hyperparameters"]["opt"]]
        per_trial = page.locator("svg.per-trial")
        assert per_trial.locator("circle").count() == 4
        assert per_trial.locator('polyline[data-name="best so far"]').count() == 1
        charts = page.locator("svg.per-parameter")
        assert [charts.nth(i).get_attribute("aria-label") for i in range(2)] == \
            ["score per x", "score per opt"]
        assert charts.nth(1).locator("text", has_text="adam").count() == 1
        assert charts.nth(0).locator("circle").count() == 4
        # trial 3's chief in the picker, as stream-logs --task-name takes it
        assert page.locator('#task option[value="3/master-replica-0"]').count() == 1
        screenshot(page, tmp_path, "console-tuning.png")


def test_a_console_on_every_address_asks_chromium_for_its_token(tmp_path, reaper):
    """`--host 0.0.0.0`: the machine's name without the token shows no page, the printed
    address (token) opens it, and its logs and cancel work; a rebinding name is refused
    with the token too. Names resolve to 127.0.0.1 inside this Chromium only."""
    import re

    from tests.console.test_console_curves import with_summaries
    from tests.console.test_console_http import stored_job
    stored_job(tmp_path)
    with_summaries(tmp_path / "fake01")  # its curves come through the token's cookie too
    log = tmp_path / "console.log"
    url = start_console(reaper, log, "--host", "0.0.0.0")
    token = re.search(r"\?token=(\S+) ", open(log).read())[1]
    port = url.rsplit(":", 1)[1]
    here = f"http://{socket.gethostname()}:{port}"
    rules = f"--host-resolver-rules=MAP {socket.gethostname()} 127.0.0.1, MAP evil.test " \
            "127.0.0.1"
    with chromium(tmp_path / "profile", rules) as page:
        assert page.goto(f"http://evil.test:{port}/jobs/fake01?token={token}").status == 421
        answer = page.goto(f"{here}/jobs/fake01")
        assert answer.status == 403 and "needs its token" in page.content()
        assert "master-replica-0" not in page.content()
        page.goto(f"{here}/jobs/fake01?token={token}")
        # the token left the address bar, for the console's own path (its cookie's)
        assert re.fullmatch(re.escape(here) + r"/console/[\w-]{32}/jobs/fake01", page.url)
        page.wait_for_function("() => document.getElementById('logs').dataset.ended",
                               timeout=30_000)
        assert "master-replica-0\tline 3" in page.locator("#logs").text_content()
        # the curves part, polled while the job runs: loss and accuracy, train and eval
        page.wait_for_function("() => document.querySelectorAll('#curves svg.curve')"
                               ".length === 2", timeout=30_000)
        assert page.locator('#curves svg[aria-label="metrics/loss"] polyline').count() == 2
        page.click("#cancel button")
        page.wait_for_function(
            "() => document.getElementById('state').textContent === 'CANCELLED'",
            timeout=30_000)
    assert records.load("fake01").state == records.CANCELLED
