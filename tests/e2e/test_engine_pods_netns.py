"""The TFJob that `--runner kubeflow` renders, its replicas run for real as the Kubeflow
Training Operator runs their pods: the trainer runs unchanged under the operator's
TF_CONFIG, with service DNS names on port 2222.

What the operator and Kubernetes would provide, and what stands in for it here:
- one pod per replica type and index: one test host (a network namespace of its own,
  tests/netns.py) running the container's `command` + `args` with its `env`;
- one headless service per pod, `<job>-<type>-<index>` (type in lower case), reached as
  `<service>.<namespace>.svc`: every host's /etc/hosts maps every service name to its
  pod's address (`ip netns exec` bind-mounts /etc/netns/<netns>/hosts over /etc/hosts;
  the files are removed at teardown, also on failure);
- TF_CONFIG, built as the operator's genClusterSpec/genTFConfigJSONStr build it: every
  replica type in lower case, `job01-chief-0.team-a.svc:2222`, the port from the
  container's `tfjob-port`, `"environment": "cloud"`;
- the image: `python` is this interpreter and PYTHONPATH names the working tree (the
  image has the sdist installed); each pod starts in an empty folder of its own, as the
  image's WORKDIR, with only PATH, HOME and LANG from outside.
The one substitution: the TFJob's `--job-dir gs://...` (what `check()` demands, since
pods cannot see local files) becomes a local folder shared by all the hosts
(namespaces share the filesystem). Writing to gs:// is covered by the other tests.

The chief trains under the ps strategy and exports; the ps and the worker serve until
they are stopped by PID with SIGTERM, as the operator's `cleanPodPolicy: Running`
deletes the pods still running when the chief is done.

Skipped, with the reason, where namespaces cannot be made (not root, no `ip netns`).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sys

import pytest
import yaml

from tests.support.common import ROOT, pid_alive
from tests.support.netns import list_namespaces, skip_reason, test_hosts
from submit.jobdef import spec as specs
from submit.packaging.package import Package
from submit.runners.engine import EngineOptions
from tests.support.trainer_runs import FAST, read, wait_exit

kubeflow = pytest.importorskip("submit.runners.kubeflow")
pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")

JOB_ID, NAMESPACE = "job01", "team-a"
GCS_JOB_DIR = "gs://mljob-test/jobs/job01"
SHA = "0" * 64
PACKAGE = Package(file_name="mljob-0.1.0.tar.gz", sha256=SHA, top_dir="mljob-0.1.0",
                  url=f"gs://mljob-staging/job01/{SHA}/mljob-0.1.0.tar.gz")
TRAINING_INPUT = {"scaleTier": "CUSTOM", "masterType": "standard", "workerCount": 1,
                  "parameterServerCount": 1}
STEPS = 30
TRAINER_ARGS = [*FAST, "--train-steps", str(STEPS), "--checkpoint-every", "0",
                "--eval-every", "0", "--log-every", "10"]
DEFAULT_PORT = 2222  # the operator's when the container names no tfjob-port
NETNS_ETC = "/etc/netns"  # where `ip netns exec` finds a namespace's own /etc files
RESOLVE = "import socket, sys; print(*(socket.gethostbyname(n) for n in sys.argv[1:]))"


def render_tfjob() -> dict:
    """The TFJob as `python -m submit ... --runner kubeflow --dry-run` prints it, read
    back from its YAML text (what `kubectl apply -f -` would take)."""
    spec = specs.resolve(specs.Flags(JOB_ID, job_dir=GCS_JOB_DIR,
                                     staging_bucket="gs://mljob-staging",
                                     args=tuple(TRAINER_ARGS)),
                         specs.training_config(TRAINING_INPUT))
    engine = kubeflow.KubeflowEngine(EngineOptions(image="img", namespace=NAMESPACE))
    engine.check(spec)
    return yaml.safe_load(engine.render(spec, PACKAGE).text)


def pods_of(tfjob: dict) -> list[tuple[str, int, dict]]:
    """(type in lower case, index, container) for every pod the operator would create."""
    pods = []
    for kind, replica in tfjob["spec"]["tfReplicaSpecs"].items():
        (container,) = replica["template"]["spec"]["containers"]
        pods += [(kind.lower(), i, container) for i in range(replica["replicas"])]
    return pods


def service_name(tfjob: dict, task_type: str, index: int) -> str:
    """The operator's GenGeneralName(job, type, index) + "." + namespace + ".svc"."""
    meta = tfjob["metadata"]
    return f"{meta['name']}-{task_type}-{index}".replace("/", "-") + \
        f".{meta['namespace']}.svc"


def tfjob_port(container: dict) -> int:
    """GetPortFromTFJob: the `tfjob-port` of the container named `tensorflow`."""
    if container["name"] == kubeflow.CONTAINER:
        for port in container.get("ports", []):
            if port["name"] == kubeflow.PORT_NAME:
                return port["containerPort"]
    return DEFAULT_PORT


def operator_tf_config(tfjob: dict, task_type: str, index: int) -> str:
    """The operator's text byte for byte: Go's json.Marshal writes a map's keys sorted
    (the cluster's types), a struct's fields in order, and no spaces."""
    cluster: dict[str, list[str]] = {}
    for kind, task, container in pods_of(tfjob):
        cluster.setdefault(kind, []).append(
            f"{service_name(tfjob, kind, task)}:{tfjob_port(container)}")
    return json.dumps({"cluster": dict(sorted(cluster.items())),
                       "task": {"type": task_type, "index": index},
                       "environment": "cloud"}, separators=(",", ":"))


@contextlib.contextmanager
def service_dns(hosts, names: dict[str, str]):
    """Every host's /etc/hosts maps each name to its address ({name: address}); the
    files and their folders are removed on the way out, whatever happened."""
    made_root = not os.path.isdir(NETNS_ETC)
    folders = [os.path.join(NETNS_ETC, host.namespace) for host in hosts]
    text = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" + \
        "".join(f"{address}\t{name}\n" for name, address in names.items())
    try:
        for folder in folders:
            os.makedirs(folder)
            with open(os.path.join(folder, "hosts"), "w") as f:
                f.write(text)
        yield folders
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
        if made_root:
            with contextlib.suppress(OSError):
                os.rmdir(NETNS_ETC)   # only when empty: another run may be using it


def pod_process(container: dict, job_dir: str) -> list[str]:
    """The container's command and args, with this interpreter for `python` and the
    shared local folder for the gs:// job dir."""
    command, args = list(container["command"]), list(container["args"])
    assert command[0] == "python" and args[args.index("--job-dir") + 1] == GCS_JOB_DIR
    args[args.index("--job-dir") + 1] = job_dir
    return [sys.executable, *command[1:], *args]


def pod_env(container: dict, tf_config: str, home: str) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": home, "LANG": "C.UTF-8"}
    env.update({item["name"]: item["value"] for item in container["env"]})
    env.update(TF_CONFIG=tf_config, PYTHONPATH=ROOT)
    return env


@pytest.mark.slow  # long: CI runs it in the slow step
def test_tfjob_pods_train_under_the_operators_tf_config(reaper, tmp_path):
    tfjob = render_tfjob()
    pods = pods_of(tfjob)
    assert [(kind, index) for kind, index, _ in pods] == \
        [("chief", 0), ("worker", 0), ("ps", 0)]
    assert operator_tf_config(tfjob, "worker", 0) == (
        '{"cluster":{"chief":["job01-chief-0.team-a.svc:2222"],'
        '"ps":["job01-ps-0.team-a.svc:2222"],"worker":["job01-worker-0.team-a.svc:2222"]},'
        '"task":{"type":"worker","index":0},"environment":"cloud"}')
    job_dir = str(tmp_path / "job")
    with test_hosts(len(pods), reaper) as hosts, \
            service_dns(hosts, {service_name(tfjob, kind, index): host.address
                                for host, (kind, index, _) in zip(hosts, pods)}) as etc:
        names = hosts.namespaces
        # In every pod the names resolve, to the pod's own address and to its peers'.
        for host in hosts:
            resolved = host.run([sys.executable, "-c", RESOLVE,
                                 *(service_name(tfjob, k, i) for k, i, _ in pods)])
            assert resolved.stdout.split() == [h.address for h in hosts], resolved.stderr

        procs, logs = {}, {}
        for host, (kind, index, container) in reversed(list(zip(hosts, pods))):
            pod = f"{kind}-{index}"   # the chief last: its peers are then starting
            workdir = tmp_path / pod
            workdir.mkdir()
            logs[pod] = tmp_path / f"{pod}.log"
            tf_config = operator_tf_config(tfjob, kind, index)
            with open(logs[pod], "wb") as out:
                procs[pod] = host.popen(pod_process(container, job_dir),
                                        env=pod_env(container, tf_config, str(workdir)),
                                        cwd=workdir, stdout=out, stderr=out)
        chief_log = logs["chief-0"]
        assert wait_exit(procs["chief-0"], 240, chief_log) == 0, read(chief_log)[-3000:]

        out = read(chief_log)
        # The ps strategy over the cluster of TF_CONFIG: one worker to train on.
        assert re.search(rf"^training started: strategy=ps step=0 train_steps={STEPS} "
                         r"model=mlp replicas=1 ", out, re.M), out[-3000:]
        assert re.search(rf"^training finished: step={STEPS} ", out, re.M), out[-3000:]
        assert os.path.exists(os.path.join(job_dir, "model", "saved_model.pb"))
        state = read(os.path.join(job_dir, "checkpoints", "checkpoint"))
        assert state.startswith(f'model_checkpoint_path: "ckpt-{STEPS}"'), state
        # The peers serve at their service names, the addresses TF_CONFIG gave them.
        for pod in ("worker-0", "ps-0"):
            kind, index = pod.split("-")
            address = f"{service_name(tfjob, kind, int(index))}:2222"
            assert f"serving {kind} {index} at {address}" in read(logs[pod]), \
                read(logs[pod])[-3000:]

        # Done: the operator deletes the pods still running; the kubelet sends SIGTERM.
        servers = [procs["worker-0"], procs["ps-0"]]
        assert [p.poll() for p in servers] == [None, None]
        for proc in servers:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc, pod in zip(servers, ("worker-0", "ps-0")):
            assert wait_exit(proc, 30, logs[pod]) == 143
            assert "stopping: got SIGTERM" in read(logs[pod])
    assert not any(pid_alive(p.pid) for p in procs.values())
    assert not set(names) & set(list_namespaces())
    assert not any(os.path.exists(folder) for folder in etc)
