"""The console's HTML, rendered on the server from job records: the jobs list, a job's page
and the parts of it the page refreshes while the job runs (`live`). Every value from a
record is escaped; charts are inline SVG (`svg.py`)."""
from __future__ import annotations

import datetime
import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import quote

import yaml

from submit import jobs
from submit.local import usage
from submit.console.svg import chart
from mljob.errors import ascii_digits

MAX_POINTS = 300  # per series in a usage chart


def iso(timestamp: float | None) -> str:
    if not isinstance(timestamp, (int, float)):
        return "-"
    return datetime.datetime.fromtimestamp(timestamp, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S")


def state_of(record: jobs.JobRecord) -> str:
    """The state `jobs list` shows: a `?` when a local job's supervisor is gone."""
    if not record.done and record.supervisor_pid and not record.supervisor_alive():
        return f"{record.state}?"
    return record.state


def duration(record: jobs.JobRecord) -> str:
    if not isinstance(record.start_time, (int, float)):
        return "-"
    end = record.end_time if isinstance(record.end_time, (int, float)) else time.time()
    seconds = max(0, int(end - record.start_time))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def tensorboard_command(record: jobs.JobRecord) -> str | None:
    """As `jobs describe` prints it: TensorBoard cannot read another process's memory://."""
    if not record.job_dir:
        return None
    logdir = record.job_dir
    if logdir.startswith("memory://") and record.log_dir:
        logdir = os.path.dirname(record.log_dir)
    return f"tensorboard --logdir {logdir}"


def layout(title: str, body: str, *, job: str = "", root: str = "") -> str:
    """A page; its links are relative to `root` (a token console's own path, where its
    cookie goes: `guard.py`), which the page names as its base."""
    return ("<!doctype html><html lang=en><head><meta charset=utf-8>"
            f'<base href="{escape(root)}/"><title>{escape(title)}</title>'
            "<link rel=stylesheet href=static/console.css>"
            f"<script src=static/console.js defer></script></head>"
            f'<body data-job="{escape(job)}"><header><a href="./">mljob console</a></header>'
            f"<main>{body}</main></body></html>")


# --- the jobs list ---------------------------------------------------------------------

def jobs_rows(records: Sequence[jobs.JobRecord]) -> str:
    if not records:
        return '<tr><td colspan=6 class=empty>no jobs</td></tr>'
    rows = []
    for r in records:
        labels = " ".join(f"<span class=label>{escape(k)}={escape(str(v))}</span>"
                          for k, v in sorted(r.labels.items()))
        state = state_of(r)
        rows.append(f'<tr data-job="{escape(r.job_id)}"><td><a href="jobs/'
                    f'{quote(r.job_id)}">{escape(r.job_id)}</a></td><td class="state '
                    f'{escape(state.rstrip("?"))}">{escape(state)}</td><td>{labels}</td>'
                    f"<td>{iso(r.create_time)}</td><td>{duration(r)}</td>"
                    f"<td>{escape(r.runner)}</td></tr>")
    return "".join(rows)


def list_page(records: Sequence[jobs.JobRecord], filter_text: str, error: str | None,
              root: str = "") -> str:
    message = f'<p class=error role=alert>{escape(error)}</p>' if error else ""
    body = (f"<h1>Jobs</h1><form method=get action=./ class=filter><label>Filter "
            f'<input name=filter size=48 value="{escape(filter_text)}" placeholder='
            '"state=RUNNING labels.team=vision jobId:tune*"></label> <button>Apply</button>'
            f"</form>{message}<table id=jobs><thead><tr><th>Job</th><th>State</th>"
            "<th>Labels</th><th>Created (UTC)</th><th>Duration</th><th>Runner</th></tr>"
            f"</thead><tbody>{jobs_rows(records)}</tbody></table>")
    return layout("Jobs", body, root=root)


# --- a job -----------------------------------------------------------------------------

def resource(record: jobs.JobRecord) -> str:
    """The record as `jobs describe` prints it (YAML, times in ISO 8601)."""
    data = json.loads(record.to_json())
    data["state"] = state_of(record)
    for key in ("create_time", "start_time", "end_time"):
        if data.get(key):
            data[key] = iso(data[key]).replace(" ", "T") + "Z"
    return yaml.safe_dump(data, sort_keys=True, default_flow_style=False).rstrip()


def replicas_table(record: jobs.JobRecord) -> str:
    cost = usage.summary_of(record)
    rows = []
    for r in record.replicas:
        u = cost.get(r.label) or {}
        cells = [r.label, r.state, "-" if r.exit_code is None else str(r.exit_code),
                 str(r.restarts), "-" if r.pid is None else str(r.pid),
                 *(f"{u[k]:g}" if k in u else "-" for k in
                   ("cpuPeak", "cpuMean", "memoryPeakMiB", "memoryMeanMiB"))]
        rows.append(f'<tr data-replica="{escape(r.label)}">' +
                    "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    head = ("<tr><th>Replica</th><th>State</th><th>Exit status</th><th>Restarts</th>"
            "<th>PID</th><th>CPU peak</th><th>CPU mean</th><th>Memory peak (MiB)</th>"
            "<th>Memory mean (MiB)</th></tr>")
    body = "".join(rows) or "<tr><td colspan=9 class=empty>no replicas yet</td></tr>"
    return f"<table id=replicas><thead>{head}</thead><tbody>{body}</tbody></table>"


def usage_charts(record: jobs.JobRecord) -> str:
    from submit.home import mljob_home
    samples = list(usage.read(os.path.join(mljob_home(), "runs", record.job_id)))
    if not samples:
        return ""
    t0 = min(s["t"] for s in samples)
    cpu: dict[str, list[tuple[float, float]]] = {}
    mem: dict[str, list[tuple[float, float]]] = {}
    for s in sorted(samples, key=lambda s: s["t"]):
        cpu.setdefault(s["label"], []).append((s["t"] - t0, s["cpu"]))
        mem.setdefault(s["label"], []).append((s["t"] - t0, s["rss"] / usage.MIB))
    return ("<section id=usage><h2>CPU and memory</h2>" +
            chart({k: _thin(v) for k, v in cpu.items()}, title="CPU per replica",
                  x_title="seconds", y_title="cores in use", css_class="chart cpu") +
            chart({k: _thin(v) for k, v in mem.items()}, title="Memory per replica",
                  x_title="seconds", y_title="resident MiB", css_class="chart memory") +
            "</section>")


def _thin(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    step = max(1, math.ceil(len(points) / MAX_POINTS))
    return points[::step]


def _mapping(value: Any) -> dict:
    """A record's object field as a dict ({} for anything else: a hand-edited record)."""
    return value if isinstance(value, dict) else {}


def _items(value: Any) -> list:
    """A record's list field as a list ([] for anything else: a number, a text, null)."""
    return value if isinstance(value, list) else []


def trials_section(record: jobs.JobRecord) -> str:
    output = _mapping(record.training_output)
    trials = [t for t in _items(output.get("trials")) if isinstance(t, dict)]
    if not trials:
        return ""
    spec = _mapping(_mapping(record.training_input).get("hyperparameters"))
    params = [p for p in _items(spec.get("params")) if isinstance(p, dict)]
    names = [str(p.get("parameterName")) for p in params] or sorted(
        {str(k) for t in trials for k in _mapping(t.get("hyperparameters"))})
    tag = str(output.get("hyperparameterMetricTag") or spec.get("hyperparameterMetricTag")
              or "objective")
    head = "".join(f"<th>{escape(h)}</th>" for h in ("Trial", "State", tag, "Step", *names))
    rows = []
    for t in trials:
        metric = _mapping(t.get("finalMetric"))
        value = _float(metric.get("objectiveValue"))
        state = str(t.get("state", "")) + (" (stopped early)"
                                           if t.get("isTrialStoppedEarly") else "")
        hp = _mapping(t.get("hyperparameters"))
        cells = [str(t.get("trialId")), state, "-" if value is None else f"{value:.6g}",
                 str(metric.get("trainingStep", "-")), *(str(hp.get(n, "-")) for n in names)]
        rows.append(f'<tr data-trial="{escape(str(t.get("trialId")))}">' +
                    "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    plots = objective_charts(trials, params, names, tag,
                             maximize=spec.get("goal", "MAXIMIZE") == "MAXIMIZE")
    return (f"<section id=trials><h2>Trials, best first</h2><table id=trials-table><thead>"
            f"<tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{plots}</section>")


def objective_charts(trials: Iterable[dict], params: Sequence[Mapping[str, Any]],
                     names: Sequence[str], tag: str, *, maximize: bool) -> str:
    """Objective per trial (with the best so far), and per parameter."""
    scored = []
    for t in trials:
        value = _mapping(t.get("finalMetric")).get("objectiveValue")
        trial_id = str(t.get("trialId", ""))
        if isinstance(value, (int, float)) and ascii_digits(trial_id):
            scored.append((int(trial_id), float(value), _mapping(t.get("hyperparameters"))))
    scored.sort(key=lambda s: s[0])
    best: list[tuple[float, float]] = []
    for trial, value, _ in scored:
        prev = best[-1][1] if best else value
        best.append((trial, max(prev, value) if maximize else min(prev, value)))
    out = [chart({"trial": [(i, v) for i, v, _ in scored], "best so far": best},
                 title=f"{tag} per trial", x_title="trial", y_title=tag, dots=("trial",),
                 css_class="chart per-trial")]
    kinds = {str(p.get("parameterName")): p for p in params}
    for name in names:
        p = kinds.get(name, {})
        values = [(hp.get(name), v) for _, v, hp in scored if name in hp]
        labels = None
        numbers = [(_float(x), v) for x, v in values]
        if p.get("type") == "CATEGORICAL" or any(x is None for x, _ in numbers):
            # a categoricalValues that is no list (a number, a text): the values seen
            cats = [str(c) for c in _items(p.get("categoricalValues"))] or sorted(
                {str(x) for x, _ in values})
            labels = {float(i): c for i, c in enumerate(cats)}
            points = [(float(cats.index(str(x))), v) for x, v in values if str(x) in cats]
        else:
            points = [(x, v) for x, v in numbers if x is not None]
        out.append(chart({name: points}, title=f"{tag} per {name}", x_title=name,
                         y_title=tag, dots=(name,), x_labels=labels,
                         log_x=p.get("scaleType") == "UNIT_LOG_SCALE",
                         css_class="chart per-parameter"))
    return "".join(out)


def _float(x: Any) -> float | None:
    """x as a finite number, else None (a category, a damaged value)."""
    try:
        value = float(x)
    except (TypeError, ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def prediction_section(record: jobs.JobRecord) -> str:
    """A batch prediction job's progress, from Cloud ML's predictionOutput when the
    record has one (its counts, and the instances done of the estimated total)."""
    output = getattr(record, "prediction_output", None) or \
        (record.training_output or {}).get("predictionOutput")
    if not isinstance(output, dict) or not output:
        return ""
    progress = output.get("progress")
    if not isinstance(progress, dict):
        progress = {}
    done = _float(progress.get("instancesDone"))
    total = _float(progress.get("instancesTotal"))
    bar = ""
    if done is not None and total is not None and total > 0:
        bar = (f'<progress max="{total:g}" value="{done:g}"></progress> '
               f"{done:g} of {total:g}")
    rows = "".join(f"<tr><th>{escape(str(k))}</th><td>{escape(str(v))}</td></tr>"
                   for k, v in sorted({**output, **progress}.items()) if k != "progress")
    return (f"<section id=prediction><h2>Batch prediction</h2>{bar}<table>{rows}</table>"
            "</section>")


def curves_section(series: Mapping[str, Mapping[str, Mapping[int, float]]],
                   note: str | None = None) -> str:
    """The job's curves (`curves.py`): one chart per tag against step, each run (train,
    eval) a line, and each run's last value; a line saying why when there are none."""
    from submit.query.curves import shown
    tags = shown(series)
    if not tags:
        why = note or "no summaries yet (the chief writes them under the job dir)"
        return f"<p class=note id=curves-note>{escape(why)}</p>"
    charts, rows = [], []
    for tag in tags:
        runs = series[tag]
        order = sorted(runs, key=lambda run: (run != "train", run != "eval", run))
        charts.append(chart({run: _thin(sorted(runs[run].items())) for run in order},
                            title=tag, x_title="step", y_title=tag.rsplit("/", 1)[-1],
                            css_class="chart curve"))
        for run in order:
            points = runs[run]
            step = max(points)
            rows.append(f'<tr data-tag="{escape(tag)}" data-run="{escape(run)}"><td>'
                        f"{escape(tag)}</td><td>{escape(run)}</td><td>{step}</td>"
                        f"<td>{points[step]:.6g}</td></tr>")
    extra = f"<p class=note>{escape(note)}</p>" if note else ""
    return ("".join(charts) + extra + "<table id=curves-last><thead><tr><th>Tag</th>"
            "<th>Run</th><th>Last step</th><th>Value</th></tr></thead><tbody>" +
            "".join(rows) + "</tbody></table>")


def live(record: jobs.JobRecord, note: str | None = None) -> str:
    """What the job page refreshes while the job runs."""
    state = state_of(record)
    error = (f'<p class=error role=alert>{escape(record.error_message)}</p>'
             if record.error_message else "")
    extra = f"<p class=note>{escape(note)}</p>" if note else ""
    return (f'<p>State <strong id=state class="state {escape(state.rstrip("?"))}" '
            f'data-done="{"1" if record.done else ""}">{escape(state)}</strong> · runner '
            f"{escape(record.runner)} · created {iso(record.create_time)} · duration "
            f"{duration(record)}</p>{error}{extra}<h2>Replicas</h2>{replicas_table(record)}"
            f"{usage_charts(record)}{trials_section(record)}{prediction_section(record)}")


def job_page(record: jobs.JobRecord, token: str, note: str | None = None,
             curves: str = "", root: str = "") -> str:
    job = record.job_id
    options = "".join(f'<option value="{escape(r.label)}">{escape(r.label)}</option>'
                      for r in record.replicas)
    board = tensorboard_command(record)
    cancel = "" if record.done else (
        f'<form method=post action="jobs/{quote(job)}/cancel" id=cancel>'
        f'<input type=hidden name=csrf value="{escape(token)}">'
        "<button type=submit>Cancel job</button></form>")
    body = (f"<h1>Job {escape(job)}</h1>{cancel}<div id=live>{live(record, note)}</div>"
            + (f"<section id=curves-part><h2>Training curves</h2><div id=curves>{curves}"
               "</div></section>" if curves else "") +
            "<h2>Logs</h2><label>Replica <select id=task><option value=''>all replicas"
            f"</option>{options}</select></label><pre id=logs aria-live=polite></pre>"
            + (f"<h2>TensorBoard</h2><pre id=tensorboard>{escape(board)}</pre>"
               if board else "") +
            f"<details><summary>Job resource</summary><pre id=resource>"
            f"{escape(resource(record))}</pre></details>")
    return layout(f"Job {job}", body, job=job, root=root)


def message_page(title: str, text: str, root: str = "") -> str:
    return layout(title, f"<h1>{escape(title)}</h1><p class=error role=alert>"
                         f"{escape(text)}</p><p><a href='./'>All jobs</a></p>", root=root)
