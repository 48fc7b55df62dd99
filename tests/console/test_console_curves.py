"""A job's training curves on its page, over real HTTP (`python -m submit console` in its
own process, httpx as the client), read from event files TensorFlow's summary writer
wrote (tests/golden/summaries, see tests/support/summaries.py): loss and accuracy against
step with train and eval on the same axes, read on as the chief appends to its file (a
record half written at one poll is read at the next), and no curves part for a tuning
job. The guard on the endpoint is in test_console_network.py, the page in Chromium in
test_console_browser.py."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.console.test_console_http import console, stored_job  # noqa: F401
from tests.support import summaries
from tests.support.summaries import GOLDEN


def with_summaries(job_dir, train_bytes: int | None = None):
    """The golden summaries under job_dir/summaries, the train file cut after
    `train_bytes` (as a chief that has not written the rest yet)."""
    shutil.copytree(f"{GOLDEN}/eval", job_dir / "summaries" / "eval")
    (job_dir / "summaries" / "train").mkdir(parents=True)
    source = next((Path(GOLDEN) / "train").iterdir())
    data = source.read_bytes()
    target = job_dir / "summaries" / "train" / source.name
    target.write_bytes(data if train_bytes is None else data[:train_bytes])
    return target, data


def last_values(html: str) -> dict[tuple[str, str], tuple[int, float]]:
    return {(tag, run): (int(step), float(value)) for tag, run, step, value in re.findall(
        r'<tr data-tag="([^"]+)" data-run="([^"]+)"><td>[^<]*</td><td>[^<]*</td>'
        r"<td>(\d+)</td><td>([^<]+)</td>", html)}


def test_curves_read_on_as_the_file_grows(tmp_path, console):  # noqa: F811
    _, client = console
    stored_job(tmp_path, "curves01")
    whole = next((Path(GOLDEN) / "train").iterdir()).stat().st_size
    target, data = with_summaries(tmp_path / "curves01", train_bytes=whole // 2 + 7)
    page = client.get("/jobs/curves01")
    assert page.status_code == 200 and "<h2>Training curves</h2>" in page.text
    half = last_values(client.get("/jobs/curves01/curves").text)
    step, _ = half[("metrics/loss", "train")]
    assert 0 < step < 1000
    target.write_bytes(data)  # the rest, and the record that was cut
    part = client.get("/jobs/curves01/curves")
    assert part.status_code == 200
    assert part.headers["x-frame-options"] == "DENY"
    full = last_values(part.text)
    assert full[("metrics/loss", "train")] == (1000, pytest.approx(
        summaries.train_loss(1000), rel=1e-5))
    assert full[("metrics/loss", "eval")] == (1000, pytest.approx(
        summaries.eval_loss(1000), rel=1e-5))
    assert full[("metrics/accuracy", "train")][1] == pytest.approx(
        1 - summaries.train_loss(1000) / 3, rel=1e-5)
    # loss first, then each metric; not the optimizer's or speed's scalars
    labels = re.findall(r'<svg class="chart curve"[^>]*aria-label="([^"]+)"', part.text)
    assert labels == ["metrics/loss", "metrics/accuracy"]
    loss = part.text.split('aria-label="metrics/loss"')[1].split("</svg>")[0]
    train = re.search(r'data-name="train"[^>]*points="([^"]+)"', loss)[1].split()
    evals = re.search(r'data-name="eval"[^>]*points="([^"]+)"', loss)[1].split()
    assert len(train) == len(summaries.TRAIN_STEPS) and len(evals) == 2
    ys = [float(p.split(",")[1]) for p in train]
    assert ys == sorted(ys)  # loss falls: drawn lower (larger y) step by step


def test_a_job_without_summaries_says_so_and_a_tuning_job_has_no_curves(tmp_path,
                                                                          console):  # noqa: F811
    _, client = console
    stored_job(tmp_path, "curves02")
    assert "no summaries yet" in client.get("/jobs/curves02/curves").text
    # a damaged event file beside a good one: the good one's curves, the page drawn
    run = tmp_path / "curves02" / "summaries" / "train"
    run.mkdir(parents=True)
    (run / "events.out.tfevents.1.damaged").write_bytes(b"\x10\0\0\0\0\0\0\0" + b"x" * 40)
    (run / "events.out.tfevents.2.host").write_bytes(
        next((Path(GOLDEN) / "train").iterdir()).read_bytes())
    part = client.get("/jobs/curves02/curves")
    assert part.status_code == 200
    assert last_values(part.text)[("metrics/loss", "train")][0] == 1000
    stored_job(tmp_path, "tune02", training_input={"hyperparameters": {"maxTrials": 2}})
    with_summaries(tmp_path / "tune02")
    assert "Training curves" not in client.get("/jobs/tune02").text
    assert "writes no training curves" in client.get("/jobs/tune02/curves").text
    assert client.get("/jobs/nosuch/curves").status_code == 404

