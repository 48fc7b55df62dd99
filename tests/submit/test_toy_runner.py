"""Adding a runner touches `submit/runners/` and the registry only: a toy runner, written
in a module of its own (here a temporary one), registered by its two registry lines
(`RUNNERS`, `OPTIONS`), gets its option in `jobs submit training --help`, its option
refused for another runner, and passes the runner conformance suite's cases."""
from __future__ import annotations

import sys
import textwrap

import pytest

from submit import runners
from submit.errors import UsageError
from submit.runners.engine import EngineOptions
from tests.submit import test_runner_conformance as conformance
from tests.support.specs import resolve as spec_of
from tests.support.submit_cli import one_error_line, run

TOY = textwrap.dedent('''
    """A toy runner: each job "runs" in this process's memory and ends as its args say."""
    from submit.errors import UsageError
    from submit.logs import format_line
    from submit.runners.engine import EngineStatus, Rendered, RunOpt, Runner

    RUNOPTS = (RunOpt("toy_speed", "how fast the toy runs its jobs", metavar="N"),)
    JOBS: dict = {}   # job id -> {"ending": ..., "cancelled": ...}
    STATES = {"succeed": "SUCCEEDED", "fail": "FAILED", "hang": "RUNNING"}


    class ToyEngine(Runner):
        name = "toy"
        max_replicas_per_type = 1

        def render(self, spec, package):
            body = {"job": spec.job_id, "args": list(spec.args),
                    "speed": self.options.toy_speed}
            return Rendered(body=body, text=f"toy job {spec.job_id}",
                            handle={"job_id": spec.job_id})

        def create(self, rendered):
            JOBS[rendered.body["job"]] = {"ending": rendered.body["args"][0],
                                          "cancelled": False}
            return dict(rendered.handle)

        def status(self, handle):
            job = JOBS[handle["job_id"]]
            if job["cancelled"]:
                return EngineStatus("CANCELLED")
            state = STATES[job["ending"]]
            return EngineStatus(state, "the replica exited with a non-zero status of 3"
                                if state == "FAILED" else None)

        def logs(self, handle, *, task_name=None, follow=True):
            if task_name not in (None, "master-replica-0"):
                raise UsageError(f"--task-name {task_name!r} names no replica of this job")
            yield format_line("master-replica-0", "conformance says hello")

        def cancel(self, handle):
            JOBS[handle["job_id"]]["cancelled"] = True
            return "CANCELLED"
''')


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy module on sys.path and its two registry lines."""
    (tmp_path / "toy_runner.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(runners.RUNNERS, "toy", "toy_runner:ToyEngine")
    monkeypatch.setitem(runners.OPTIONS, "toy", "toy_runner:RUNOPTS")
    import toy_runner
    yield toy_runner
    sys.modules.pop("toy_runner", None)


class ToyFar(conformance.Far):
    package = None

    def __init__(self, tmp_path, monkeypatch):
        self.tmp = tmp_path
        import toy_runner
        self.jobs = toy_runner.JOBS

    def runner(self):
        return runners.get("toy")(EngineOptions(toy_speed="3"))

    def spec(self, job_id, ending):
        return spec_of(job_id, {}, job_dir=str(self.tmp / job_id), args=[ending])

    def refused(self):
        return spec_of("big", {"scaleTier": "CUSTOM", "masterType": "standard",
                               "workerType": "standard", "workerCount": 2},
                       job_dir=str(self.tmp / "big"))

    def cancelled(self, job_id):
        return self.jobs[job_id]["cancelled"]


def test_a_runners_option_is_in_help_and_refused_for_another_runner(toy, capsys):
    with pytest.raises(UsageError, match="--ray-address is for --runner ray"):
        toy.ToyEngine(EngineOptions(ray_address="http://127.0.0.1:8265"))
    status, out, err = run(capsys, "jobs", "submit", "training", "--help")
    assert status == 0, err
    assert "--toy-speed N" in out and "toy: how fast the toy runs its jobs" in out
    assert "[local|kubeflow|vertex|ray|toy]" in out
    status, out, err = run(capsys, "jobs", "submit", "training", "j1", "--toy-speed", "3",
                           "--job-dir", "/tmp/never-made", "--package-path", "/no-package")
    assert status != 0
    assert one_error_line(err) == ("error: --toy-speed is for --runner toy, not --runner "
                                   "local; drop it or change --runner")


def test_the_toy_runner_passes_the_conformance_suite(toy, tmp_path, monkeypatch):
    monkeypatch.setitem(conformance.FARS, "toy", ToyFar)
    conformance.test_every_runner_is_in_the_suite()
    for case in (conformance.test_check_takes_a_job_and_refuses_one_it_cannot_run,
                 conformance.test_render_is_the_job_object_and_starts_nothing,
                 conformance.test_a_job_that_succeeds, conformance.test_a_job_that_fails,
                 conformance.test_a_job_that_is_cancelled):
        case(ToyFar(tmp_path, monkeypatch))
    assert toy.ToyEngine(EngineOptions(toy_speed="3")).render(
        ToyFar(tmp_path, monkeypatch).spec("s1", "succeed"), None).body["speed"] == "3"
