"""Container jobs on the local runner, for real, with a small image of this machine's own
Python (tests/support/fixture_image.py: made in seconds, no network), so that they run
in the default test run: what a job leaves (no container, no network) after it failed,
was cancelled or was interrupted, even when its containers were gone before its end; an
earlier run's containers and network (a killed launcher's) removed before the job id
runs again; a replica's SIGTERM reaching it through the engine and the init, its own
exit status recorded (not the SIGKILL after the grace period); and each container's CPU
weight and cgroup. TensorFlow in containers: tests/e2e/test_containers.py (slow).
Skipped where podman is not installed (.ci/setup installs it)."""
from __future__ import annotations

import shutil
import signal
import subprocess
import time

import pytest
import yaml

from submit import jobs as records
from submit.local import container_engine as ce
from tests.support import fixture_image
from tests.support.common import ROOT
from tests.support.submit_cli import run

pytestmark = pytest.mark.skipif(shutil.which("podman") is None,
                                reason="podman is not installed (.ci/setup installs it)")

# A replica: says it is up, then sleeps ARGV[1] seconds and exits ARGV[2]; on SIGTERM
# it says so and exits 143 (as mljob's replicas do) after ARGV[3] seconds, or, with
# ARGV[4] "default", dies of SIGTERM's default action (as a replica does before it
# installs its handler, while TensorFlow imports).
REPLICA = ("import signal, sys, time; a = sys.argv[1:] + ['0', '0', '0', '']; "
           "a[3] == 'default' or signal.signal(signal.SIGTERM, lambda *_: (print("
           "'stopping on SIGTERM', flush=True), time.sleep(float(a[2])), sys.exit(143))); "
           "print('replica up', flush=True); time.sleep(float(a[0])); sys.exit(int(a[1]))")


@pytest.fixture(scope="module")
def engine():
    return ce.detect("podman")


@pytest.fixture(scope="module")
def image(engine):
    return fixture_image.image(engine)


@pytest.fixture(autouse=True)
def _nothing_left_behind(engine):
    """Whatever a test's job left (when the code under test fails to remove it) is gone
    before the next test, which may use the same job id."""
    yield
    for job_id in ("cfail", "ccancel", "cint", "crerun", "cboth", "cshare"):
        forget(engine, job_id)


def config(tmp_path, image: str, *, chief=("300",), worker=None, ps=None,
           machine="n1-standard-2") -> str:
    def replica(args):
        return {"containerCommand": ["python3", "-c", REPLICA], "containerArgs": list(args)}
    ti = {"scaleTier": "CUSTOM", "masterType": machine,
          "masterConfig": {**replica(chief), "imageUri": image}}
    if worker is not None:
        ti.update(workerType=machine, workerCount=1, workerConfig=replica(worker))
    if ps is not None:
        ti.update(parameterServerType=machine, parameterServerCount=1,
                  parameterServerConfig=replica(ps))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"trainingInput": ti}))
    return str(path)


def wait_for(what: str, ready, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def record_or_none(job_id: str):
    try:
        return records.load(job_id)
    except Exception:  # not written yet
        return None


def forget(engine, job_id: str) -> None:
    """Whatever a job id left, removed by the engine's own commands (not by the code
    under test, which a planted fault may break)."""
    label = f"label={ce.JOB_LABEL}={job_id}"
    names = subprocess.run([engine.path, "ps", "-aq", "--filter", label],
                           capture_output=True, text=True).stdout.split()
    if names:
        subprocess.run([engine.path, "rm", "-f", "-t", "0", *names], capture_output=True)
    subprocess.run([engine.path, "network", "rm", "-f", ce.network_name(job_id)],
                   capture_output=True)


def up(job_dir, label="master-replica-0") -> bool:
    try:
        return "replica up" in (job_dir / "logs" / f"{label}.log").read_text()
    except OSError:
        return False


def test_a_failed_job_leaves_no_container_and_no_network(capsys, engine, image, tmp_path):
    """The chief exits 3 while a worker runs: the job fails, and its end removes the
    worker's container and the network, though the chief's was gone already."""
    status, out, err = run(capsys, "cfail", "--config",
                           config(tmp_path, image, chief=("1", "3"), worker=("300",)),
                           "--job-dir", str(tmp_path / "out"))
    assert status != 0
    assert "master-replica-0 exited with a non-zero status of 3" in err, err[-2000:]
    assert ce.leftovers(engine, "cfail") == ([], [])


def test_cancel_stops_each_replica_by_sigterm_and_leaves_nothing(capsys, engine, image,
                                                                 tmp_path):
    """`jobs cancel`: each replica's SIGTERM reaches its process through the engine and
    the container's init (a process of PID 1 would ignore a SIGTERM it has no handler
    for: the ps has none); a worker that takes 2 s to stop (within the grace period)
    ends with its own status, 143, not SIGKILL's 137; nothing is left."""
    job_dir = tmp_path / "out"
    status, _, err = run(capsys, "ccancel", "--config",
                         config(tmp_path, image, worker=("300", "0", "2"),
                                ps=("300", "0", "0", "default")),
                         "--job-dir", str(job_dir), "--async")
    assert status == 0, err
    wait_for("the replicas to run", lambda: all(
        up(job_dir, label) for label in ("master-replica-0", "worker-replica-0",
                                         "ps-replica-0")))
    status, out, err = run(capsys, "jobs", "cancel", "ccancel")
    assert status == 0, err
    record = wait_for("the cancel", lambda: (r := record_or_none("ccancel")) and r.done and r)
    assert record.state == records.CANCELLED
    assert {r.label: r.exit_code for r in record.replicas} == {
        "master-replica-0": 143, "worker-replica-0": 143, "ps-replica-0": 143}
    assert "stopping on SIGTERM" in (job_dir / "logs" / "worker-replica-0.log").read_text()
    assert ce.leftovers(engine, "ccancel") == ([], [])


def test_an_interrupted_job_leaves_nothing(engine, image, tmp_path, reaper):
    """Ctrl-C to `python -m submit` following its job: CANCELLED, nothing left."""
    job_dir = tmp_path / "out"
    proc = reaper.python("-m", "submit", "cint", "--config", config(tmp_path, image),
                         "--job-dir", str(job_dir), cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    wait_for("the chief to run", lambda: up(job_dir))
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert records.load("cint").state == records.CANCELLED
    assert ce.leftovers(engine, "cint") == ([], [])


def test_an_earlier_runs_containers_and_network_go_before_the_job_runs(capsys, engine,
                                                                       image, tmp_path):
    """What a killed launcher left of job id `crerun` (its network, a replica's stopped
    container, under the names and label the job's own have) is removed before the job
    runs: it does not fail with "could not create network"."""
    label = f"{ce.JOB_LABEL}=crerun"
    forget(engine, "crerun")
    subprocess.run([engine.path, "network", "create", "--label", label,
                    ce.network_name("crerun")], check=True, capture_output=True)
    subprocess.run([engine.path, "create", "--label", label, "--name",
                    ce.container_name("crerun", "master-replica-0"), "--network",
                    ce.network_name("crerun"), image, "python3", "-c", "pass"],
                   check=True, capture_output=True)
    try:
        status, out, err = run(capsys, "crerun", "--config",
                               config(tmp_path, image, chief=("0",)),
                               "--job-dir", str(tmp_path / "out"))
        assert status == 0, err[-2000:]
        assert "Job [crerun] SUCCEEDED." in out
        assert ce.leftovers(engine, "crerun") == ([], [])
    finally:
        forget(engine, "crerun")


def test_remove_job_removes_containers_and_network_together(engine, image):
    label = f"{ce.JOB_LABEL}=cboth"
    forget(engine, "cboth")
    try:
        subprocess.run([engine.path, "network", "create", "--label", label,
                        ce.network_name("cboth")], check=True, capture_output=True)
        subprocess.run([engine.path, "create", "--label", label, "--name",
                        ce.container_name("cboth", "ps-replica-0"), image, "python3"],
                       check=True, capture_output=True)
        assert ce.leftovers(engine, "cboth") == (["mljob-cboth-ps-replica-0"],
                                                 ["mljob-cboth"])
        ce.remove_job(engine, "cboth")
        assert ce.leftovers(engine, "cboth") == ([], [])
    finally:
        forget(engine, "cboth")


def test_a_container_weighs_its_machine_types_vcpus_beside_the_processes(capsys, engine,
                                                                         image, tmp_path):
    """Each replica's container gets its machine type's vCPUs as CPU shares (1024 each),
    and, under cgroup v1 with podman's cgroupfs manager, sits beside this process's own
    cgroup (where a replica process would be), not under podman's libpod_parent with
    every other container."""
    job_dir = tmp_path / "out"
    status, _, err = run(capsys, "cshare", "--config",
                         config(tmp_path, image, machine="n1-standard-4"),
                         "--job-dir", str(job_dir), "--async")
    assert status == 0, err
    try:
        wait_for("the chief to run", lambda: up(job_dir))
        name = ce.container_name("cshare", "master-replica-0")
        shares = subprocess.run(
            [engine.path, "inspect", "--format", "{{.HostConfig.CpuShares}}", name],
            capture_output=True, text=True).stdout.strip()
        assert shares == "4096"
        parent = ce.cgroup_parent(engine)
        if parent is not None:
            pid = subprocess.run([engine.path, "inspect", "--format", "{{.State.Pid}}",
                                  name], capture_output=True, text=True).stdout.strip()
            with open(f"/proc/{pid}/cgroup") as f:
                cpu = next(line.split(":", 2)[2] for line in f.read().splitlines()
                           if "cpu" in line.split(":")[1].split(","))
            assert cpu.startswith(parent.rstrip("/") + "/libpod-"), cpu
            assert "libpod_parent" not in cpu
    finally:
        run(capsys, "jobs", "cancel", "cshare")
        wait_for("the cancel", lambda: (r := record_or_none("cshare")) and r.done)
    assert ce.leftovers(engine, "cshare") == ([], [])


def test_the_cgroup_parent_is_this_processes_cpu_cgroup(tmp_path, monkeypatch):
    answers = {"info": "cgroupfs v1\n"}
    monkeypatch.setattr(ce, "call", lambda engine, *args, **kw: subprocess.CompletedProcess(
        args, 0, answers[args[0]], ""))
    podman = ce.Engine("podman", "/usr/bin/podman")
    cgroups = tmp_path / "cgroup"
    cgroups.write_text("5:memory:/a\n3:cpu,cpuacct:/jobs/x\n0::/\n")
    assert ce.cgroup_parent(podman, str(cgroups)) == "/jobs/x"
    assert ce.cgroup_parent(ce.Engine("docker", "/usr/bin/docker"), str(cgroups)) is None
    answers["info"] = "systemd v2\n"
    assert ce.cgroup_parent(podman, str(cgroups)) is None


def test_a_container_that_stopped_by_itself_is_told_from_a_running_one(engine, image):
    """What the supervisor asks once a replica's grace period is over: whether its
    container stopped by itself (its engine's `run` is only tearing it down: wait for
    its own status) or still runs (SIGKILL)."""
    from submit.local import containers
    from submit.local.plan import ReplicaPlan
    name = ce.container_name("cstopped", "worker-replica-0")

    def replica(container):
        return ReplicaPlan("worker-replica-0", "worker", 0, None, (), {}, {}, "/dev/null",
                           container=container)

    plan = replica({"name": name, "engine": engine.path, "kind": engine.kind,
                    "image": image})
    try:
        subprocess.run([engine.path, "run", "-d", "--name", name, "--label",
                        f"{ce.JOB_LABEL}=cstopped", image, "python3", "-c",
                        "import time; time.sleep(300)"], check=True, capture_output=True)
        assert not containers.stopped(plan)               # running: it gets the SIGKILL
        subprocess.run([engine.path, "stop", "-t", "0", name], check=True,
                       capture_output=True)
        assert containers.stopped(plan)                   # exited, not yet removed
        forget(engine, "cstopped")
        assert containers.stopped(plan)                   # removed (`--rm`)
        assert not containers.stopped(replica(None))      # a process: never
    finally:
        forget(engine, "cstopped")
