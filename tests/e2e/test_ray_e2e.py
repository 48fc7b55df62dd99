"""`--runner ray` on a real Ray cluster started here: a head (`ray start --head`, its
dashboard on 127.0.0.1, 3 logical CPUs), stopped by PID when the module ends.

The bundled trainer runs for real in Ray actors: a ps job shaped like STANDARD_1 (a
master, a worker and a ps, each on n1-standard-1 machines: 1 vCPU, so the three fit the
head) and a MultiWorkerMirroredStrategy job, both to SUCCEEDED with the model exported;
`jobs describe`, `jobs stream-logs --task-name` and `jobs cancel` on a job submitted with
--async; and a job the cluster can never hold, refused in one line before anything is
staged. Ray itself names the node by its machine address (it replaces 127.0.0.1 with a
reachable one), which is what the replicas' TF_CONFIG holds.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest
import yaml

from submit import jobs as records
from tests.support.ray_cluster import head, job_processes, skip_reason, start_node
from tests.support.submit_cli import nothing_written, one_error_line, run
from tests.support.trainer_runs import FAST

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]

TRAIN = [*FAST, "--train-steps", "30", "--checkpoint-every", "0", "--eval-every", "0",
         "--log-every", "10"]
ONE_CPU = "n1-standard-1"
PS_JOB = {"trainingInput": {"scaleTier": "CUSTOM", "masterType": ONE_CPU,
                            "workerType": ONE_CPU, "parameterServerType": ONE_CPU,
                            "workerCount": 1, "parameterServerCount": 1}}
MWMS_JOB = {"trainingInput": {"scaleTier": "CUSTOM", "masterType": ONE_CPU,
                              "workerType": ONE_CPU, "workerCount": 1,
                              "useChiefInTfConfig": True}}


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    with head(str(tmp_path_factory.mktemp("ray")), num_cpus=3) as node:
        yield node


def config(tmp_path, body) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(body))
    return str(path)


def submit(capsys, ray_head, tmp_path, job_id, body, *extra, args=TRAIN):
    return run(capsys, job_id, "--runner", "ray", "--ray-address", ray_head.dashboard,
               "--config", config(tmp_path, body), "--job-dir", str(tmp_path / "out"),
               *extra, "--", *args)


def test_a_ps_job_runs_to_succeeded_and_exports(capsys, ray_head, tmp_path):
    status, out, err = submit(capsys, ray_head, tmp_path, "rayps", PS_JOB)
    assert status == 0, err[-3000:]
    assert "Job [rayps] SUCCEEDED." in out
    assert "\tmaster-replica-0\ttraining started: strategy=ps" in out
    assert "\tmaster-replica-0\tstep 30/30 loss=" in out
    assert f"exported model to {tmp_path / 'out'}/model" in out
    assert os.path.exists(tmp_path / "out" / "model" / "saved_model.pb")
    assert "oneDNN custom operations" not in out   # start-up noise dropped
    record = records.load("rayps")
    assert record.state == records.SUCCEEDED and record.runner == "ray"
    states = {r.label: r.state for r in record.replicas}
    # the ps and the worker were stopped when the chief ended
    assert states == {"master-replica-0": "EXITED", "worker-replica-0": "STOPPED",
                      "ps-replica-0": "STOPPED"}
    assert job_processes("rayps") == []


def test_a_multiworker_job_runs_to_succeeded_and_exports(capsys, ray_head, tmp_path):
    status, out, err = submit(capsys, ray_head, tmp_path, "raymw", MWMS_JOB)
    assert status == 0, err[-3000:]
    assert "training started: strategy=multiworker" in out and "replicas=2" in out
    assert os.path.exists(tmp_path / "out" / "model" / "saved_model.pb")


def test_describe_stream_logs_and_cancel(capsys, ray_head, tmp_path):
    """The cancel stops the chief first (it saves the step it reached, the ps still
    serving, and exits 143), then the worker, then the ps: with no periodic checkpoint
    (--checkpoint-every 0), the newest checkpoint holds every step the chief logged."""
    from submit.runners import ray as rayrunner
    from tests.support.faults import checkpoint_steps
    long_run = [*FAST, "--train-steps", "1000000", "--checkpoint-every", "0",
                "--eval-every", "0", "--log-every", "50"]

    def chief_steps() -> list[int]:
        """The steps the chief logged so far (the Ray job's log, read once)."""
        from submit.runners import ray as ray_runner
        handle = records.load("raycancel").engine
        text = ray_runner._get_logs(ray_runner._client(handle["address"]), handle)
        texts = [line.split("\t", 3)[-1] for line in text.splitlines()
                 if line.split("\t", 3)[2:3] == ["master-replica-0"]]
        return [int(t.split()[1].split("/")[0]) for t in texts if t.startswith("step ")]
    status, out, err = submit(capsys, ray_head, tmp_path, "raycancel", PS_JOB, "--async",
                              args=long_run)
    assert status == 0, err
    deadline = time.monotonic() + 240
    while True:  # RUNNING, the three replica processes started, the chief training
        status, out, _ = run(capsys, "jobs", "describe", "raycancel")
        if yaml.safe_load(out)["state"] == "RUNNING" and \
                len(job_processes("raycancel")) >= 3 and chief_steps():
            break
        assert time.monotonic() < deadline, out
        time.sleep(2)
    status, out, err = run(capsys, "jobs", "cancel", "raycancel")
    assert status == 0, err
    record = records.load("raycancel")
    assert record.state == records.CANCELLED
    deadline = time.monotonic() + 30
    while job_processes("raycancel") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job_processes("raycancel") == []     # every replica process stopped
    status, out, _ = run(capsys, "jobs", "stream-logs", "raycancel", "--task-name",
                         "service")
    *lines, last = out.splitlines()
    assert last == "Job [raycancel] CANCELLED."
    assert lines and all("\tservice\t" in line for line in lines)
    assert any("replica ps-replica-0 state=RUNNING" in line for line in lines)
    stops = [e for e in map(rayrunner.parse_event, lines) if e and e[1]["state"] == "STOPPED"]
    assert [label for label, _ in stops] == [
        "master-replica-0", "worker-replica-0", "ps-replica-0"], stops
    assert stops[0][1]["exit"] == "143", stops  # the chief saved and exited as preempted
    logged = max(chief_steps())
    newest = checkpoint_steps(str(tmp_path / "out"))[-1]
    print(f"ray cancel: last step logged {logged}, newest checkpoint {newest}")
    assert newest >= logged


def test_a_job_the_cluster_cannot_hold_is_one_line(capsys, ray_head, tmp_path):
    too_big = {"trainingInput": {"scaleTier": "CUSTOM", "masterType": ONE_CPU,
                                 "workerType": ONE_CPU, "workerCount": 3,
                                 "parameterServerType": ONE_CPU,
                                 "parameterServerCount": 1}}
    status, _, err = submit(capsys, ray_head, tmp_path, "raybig", too_big)
    assert status != 0
    line = one_error_line(err)
    assert "cannot place the job's 5 replicas" in line and ray_head.dashboard in line
    nothing_written(tmp_path / "out")


# Through `submit.runners.ray._client` in a process of its own: Ray reads RAY_AUTH_MODE
# and the token once, when a process first asks.
PROBE = """
import sys
from submit.errors import SubmitError
from submit.runners import ray
try:
    ray._client(sys.argv[1]).get_version()
except SubmitError as exc:
    print(exc)
    sys.exit(3)
print("answered")
"""


def test_a_cluster_with_token_authentication(tmp_path):
    """A head with Ray's token authentication on: without the token the runner says in
    one line what to set; with RAY_AUTH_MODE=token and the token, its probe and the
    SDK's client both pass."""
    token = uuid.uuid4().hex + uuid.uuid4().hex
    node = start_node(str(tmp_path / "ray"), num_cpus=1,
                      env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    try:
        assert node.dashboard is not None
        bare = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        refused = subprocess.run([sys.executable, "-c", PROBE, node.dashboard], env={
            **bare, "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=120)
        assert refused.returncode == 3, refused.stdout + refused.stderr[-2000:]
        assert "asks for its authentication token (401" in refused.stdout
        given = subprocess.run([sys.executable, "-c", PROBE, node.dashboard], env={
            **bare, "HOME": str(tmp_path), "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": token}, capture_output=True, text=True, timeout=120)
        assert given.returncode == 0, given.stdout + given.stderr[-2000:]
        assert given.stdout.strip().endswith("answered")
    finally:
        node.stop()
    assert node.pids() == []
