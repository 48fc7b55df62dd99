"""One way to supervise a job detached: `submit.local.entry.detach` starts the one
hidden command, `python -m submit _supervise KIND FILE`, for every kind of job
supervised on this machine (a training or tuning job, a tuning job on Ray, a batch
prediction job), and `entry.supervise` is the one run under the job's lock."""
from __future__ import annotations

import os
import signal

from mljob import contracts, procs
from submit import jobs as records
from submit.__main__ import SUPERVISED
from submit.local import entry
from submit.cli.cli_base import cli
from tests.support.common import ROOT
from tests.support.submit_cli import one_error_line, run

KINDS = {"job", "ray-tuning", "prediction"}


def sources() -> dict[str, str]:
    found = {}
    for folder, _, names in os.walk(os.path.join(ROOT, "submit")):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    found[os.path.relpath(path, ROOT)] = f.read()
    return found


def test_one_hidden_supervise_command_for_every_kind(capsys, tmp_path):
    assert set(SUPERVISED) == KINDS
    assert sorted(n for n in cli.commands if n.startswith("_supervise")) == ["_supervise"]
    body = tmp_path / "body.json"
    body.write_text("{}")
    status, _, err = run(capsys, "_supervise", "training", str(body))
    assert status == 2 and "'training' is not one of" in one_error_line(err)


def test_one_detach_and_one_run_under_the_lock():
    code = sources()
    starts = sorted(p for p, text in code.items() if '"-m", "submit"' in text)
    assert starts == [os.path.join("submit", "local", "entry.py")], starts
    locks = sorted(p for p, text in code.items() if "hold_lock(" in text)
    assert locks == [os.path.join("submit", "local", "entry.py")], locks


def test_supervise_holds_the_lock_and_owns_the_record_while_the_work_runs():
    record = records.JobRecord(job_id="sup01")
    records.save(record)
    seen = {}

    def work(terminal):
        seen["lock"] = procs.holds_open(os.getpid(), records.lock_path("sup01"))
        seen["owner"] = records.load("sup01").supervisor_pid
        return "done"
    assert entry.supervise(record, work, stream=False) == "done"
    assert seen == {"lock": True, "owner": os.getpid()}
    assert not procs.holds_open(os.getpid(), records.lock_path("sup01"))  # released


def test_detach_starts_the_one_command_marked_with_the_job(tmp_path):
    body = tmp_path / "plan.json"
    body.write_text("{}")  # not a plan: the supervisor says so in its log and ends
    pid = entry.detach("job", "sup02", str(tmp_path), str(body))
    try:
        env = procs.environment(pid)
        assert env.get(contracts.MLJOB_JOB_ID_ENV) == "sup02"
        assert procs.command_line(pid)[-4:] == ["submit", "_supervise", "job", str(body)]
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)  # it leads a session of its own
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
    assert (tmp_path / "supervisor.log").exists()
