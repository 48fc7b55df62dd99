"""docs/notebook.ipynb executed headless as Jupyter runs it (nbclient on a real IPython
kernel, from docs/ as its folder): a training job submitted with its progress, followed
and interrupted (SIGINT to the kernel, what the stop button sends) with the job going
on, waited for, its curves read without TensorFlow in the kernel, a tuning job, a
version deployed and asked, a batch prediction job, a job cancelled, and mistakes as
one-line UsageErrors. Nothing but the API's own progress lines reaches a cell's stderr
(no third-party warnings)."""
from __future__ import annotations

import importlib.util
import os
import re

import pytest

from mljob import procs
from submit import jobs as records
from tests.support.common import ROOT

pytestmark = pytest.mark.slow
NOTEBOOK = os.path.join(ROOT, "docs", "notebook.ipynb")


def _outputs(cell, name: str) -> str:
    return "".join(o.get("text", "") for o in cell.outputs
                   if o.output_type == "stream" and o.name == name)


def test_the_notebook_runs_headless(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("MLJOB_NOTEBOOK_DIR", str(tmp_path / "work"))
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)  # a user's default
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": os.path.dirname(
                                         NOTEBOOK)}})
    try:
        client.execute()  # a cell that raises fails here, naming it
    finally:
        nbformat.write(notebook, str(tmp_path / "executed.ipynb"))
    cells = {c.metadata["tags"][0]: c for c in notebook.cells
             if c.cell_type == "code" and c.metadata.get("tags")}
    assert set(cells) == {"setup", "submit", "follow", "wait", "curves", "tuning", "deploy",
                          "batch", "cancel", "mistakes"}

    submitted = cells["submit"]
    assert "[nb_fashion] Job [nb_fashion] submitted successfully to local." in _outputs(
        submitted, "stderr")
    assert "Job('nb_fashion'" in submitted.outputs[-1]["data"]["text/plain"]
    followed = _outputs(cells["follow"], "stdout")
    assert re.search(r"^interrupted; the job goes on: (PREPARING|RUNNING)$", followed,
                     re.M), followed
    assert "Stopped following; job [nb_fashion] goes on" in followed
    assert "followed to its end" not in followed
    assert _outputs(cells["wait"], "stdout").startswith("SUCCEEDED BASIC {'notebook': 'demo'}")
    if importlib.util.find_spec("ipywidgets") is None:  # progress as lines on stderr
        assert "[nb_fashion] SUCCEEDED, step 300/300" in _outputs(cells["wait"], "stderr")
    else:  # tqdm's notebook bar, its last state kept with the notebook's widgets
        bars = [o for o in cells["wait"].outputs if o.output_type == "display_data"
                and "application/vnd.jupyter.widget-view+json" in o.data]
        assert len(bars) == 1 and bars[0].data["text/plain"].startswith("nb_fashion:")
        state = notebook.metadata.widgets["application/vnd.jupyter.widget-state+json"][
            "state"]
        values = [w["state"] for w in state.values()]
        assert {"value": 300.0, "max": 300.0, "bar_style": "success"} in [
            {k: v.get(k) for k in ("value", "max", "bar_style")} for v in values]
        assert any("300/300" in str(v.get("value")) and "SUCCEEDED" in str(v.get("value"))
                   for v in values)

    curves = _outputs(cells["curves"], "stdout").splitlines()
    assert curves[0].startswith("train loss by step: [(") and curves[1].startswith(
        "eval loss by step: [(100, ")
    assert curves[2] == "TensorFlow loaded in this kernel: False"

    trials = _outputs(cells["tuning"], "stdout").splitlines()
    assert len(trials) == 2 and all(" SUCCEEDED {'learning_rate': 0." in t for t in trials)
    assert all(t.split()[-2] == "100" for t in trials)  # trainingStep, a number

    deployed = _outputs(cells["deploy"], "stdout").splitlines()
    assert [line.split()[:2] for line in deployed[:3]] == [["0", "class"], ["1", "class"],
                                                           ["2", "class"]]
    assert deployed[3].startswith("v1 Endpoint('nb_fashion', version='v1'") and \
        deployed[3].endswith("stopped)")
    assert _outputs(cells["batch"], "stdout") == "3 predicted\n"
    cancelled = _outputs(cells["cancel"], "stdout").splitlines()
    assert "is still" in cancelled[0] and cancelled[1] == "CANCELLED"
    assert cancelled[2] == "JobCancelled: job nb_long was cancelled"
    mistakes = _outputs(cells["mistakes"], "stdout").splitlines()
    assert mistakes[0].startswith("WrongType: submit(args=...) is '--model mlp'")
    assert mistakes[1].startswith("BadValue: Job.wait(timeout=...) is nan")
    assert mistakes[2].startswith("BadValue: list_jobs(limit=...) is -1")
    assert mistakes[3] == "['nb_fashion']"

    # no cell shows anything on stderr but the API's progress lines
    for tag, cell in cells.items():
        noise = [line for line in _outputs(cell, "stderr").splitlines()
                 if line.strip() and not line.startswith("[nb_")]
        assert noise == [], (tag, noise)
    # every job ended, and nothing any of them started is left running
    for job_id in ("nb_fashion", "nb_tune", "nb_batch", "nb_long"):
        record = records.load(job_id)
        assert record.done, (job_id, record.state)
        assert [r.pid for r in record.replicas if r.pid and procs.pid_alive(r.pid)] == []
