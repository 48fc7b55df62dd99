"""The JobSet that `--runner kubeflow --api jobset` renders, its pods run for real as
JobSet and the kubelet would run them: the trainer trains under the TF_CONFIG written in
the manifest, at JobSet's stable host names, on port 2222.

What JobSet, the Job controller and the kubelet would provide, and what stands in for
it here (as tests/e2e/test_engine_pods_netns.py does for the TFJob):
- one pod per replicatedJob and Job index (every Job has one pod): one test host, a
  network namespace of its own, running the container's `command` + `args`;
- the headless service JobSet creates for `network.subdomain`: every host's /etc/hosts
  maps `<jobset>-<rjob>-<jobIndex>-0.<subdomain>` to that pod's address;
- the container's env as the kubelet makes it: MLJOB_REPLICA_INDEX from the pod's label
  `jobset.sigs.k8s.io/job-index` (the downward API), then `$(VAR)` substituted and `$$`
  made `$` in TF_CONFIG's value (`tests/submit/test_runner_jobset.py::kubelet_env`);
- the image: this interpreter with the working tree on PYTHONPATH, an empty folder as
  WORKDIR, only PATH, HOME and LANG from outside.
The one substitution, as for the TFJob: the `--job-dir gs://...` argument becomes a local
folder shared by the hosts.

The chief trains under the ps strategy and exports; then, as the success policy on the
chief makes JobSet delete the Jobs still running, the ps and the worker are sent SIGTERM
by PID. Slow (three TensorFlow processes); skipped where namespaces cannot be made.
"""
from __future__ import annotations

import os
import re
import signal
import sys

import pytest
import yaml

from tests.support.common import ROOT, pid_alive
from tests.support.netns import list_namespaces, skip_reason, test_hosts
from tests.support.trainer_runs import read, wait_exit
from tests.support.specs import resolve as spec_of
from tests.e2e.test_engine_pods_netns import (
    GCS_JOB_DIR, PACKAGE, RESOLVE, STEPS, TRAINER_ARGS, TRAINING_INPUT, pod_process,
    service_dns)

kubeflow = pytest.importorskip("submit.runners.kubeflow")
from submit.runners.engine import EngineOptions  # noqa: E402
from tests.submit.test_runner_jobset import kubelet_env  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")]


def render_jobset() -> dict:
    spec = spec_of("job01", TRAINING_INPUT, job_dir=GCS_JOB_DIR,
                         staging_bucket="gs://mljob-staging", args=TRAINER_ARGS)
    engine = kubeflow.KubeflowEngine(EngineOptions(image="img", namespace="team-a",
                                                     api="jobset"))
    engine.check(spec)
    return yaml.safe_load(engine.render(spec, PACKAGE).text)


def pods_of(jobset: dict) -> list[tuple[str, int, str, dict]]:
    """(rjob, job index, FQDN, replicated job) of every pod JobSet would create."""
    name, subdomain = jobset["metadata"]["name"], jobset["spec"]["network"]["subdomain"]
    return [(rjob["name"], i, f"{name}-{rjob['name']}-{i}-0.{subdomain}", rjob)
            for rjob in jobset["spec"]["replicatedJobs"] for i in range(rjob["replicas"])]


def test_jobset_pods_train_under_the_manifests_tf_config(reaper, tmp_path):
    jobset = render_jobset()
    pods = pods_of(jobset)
    assert [(kind, i, fqdn) for kind, i, fqdn, _ in pods] == [
        ("chief", 0, "job01-chief-0-0.job01"), ("worker", 0, "job01-worker-0-0.job01"),
        ("ps", 0, "job01-ps-0-0.job01")]
    job_dir = str(tmp_path / "job")
    with test_hosts(len(pods), reaper) as hosts, \
            service_dns(hosts, {fqdn: host.address
                                for host, (_, _, fqdn, _) in zip(hosts, pods)}) as etc:
        names = hosts.namespaces
        for host in hosts:  # every pod resolves every stable host name
            resolved = host.run([sys.executable, "-c", RESOLVE, *(p[2] for p in pods)])
            assert resolved.stdout.split() == [h.address for h in hosts], resolved.stderr

        procs, logs = {}, {}
        for host, (kind, index, _, rjob) in reversed(list(zip(hosts, pods))):
            pod = f"{kind}-{index}"  # the chief last, as in the TFJob's test
            workdir = tmp_path / pod
            workdir.mkdir()
            logs[pod] = tmp_path / f"{pod}.log"
            (container,) = rjob["template"]["spec"]["template"]["spec"]["containers"]
            env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(workdir),
                   "LANG": "C.UTF-8", **kubelet_env(rjob, index), "PYTHONPATH": ROOT}
            with open(logs[pod], "wb") as out:
                procs[pod] = host.popen(pod_process(container, job_dir), env=env,
                                        cwd=workdir, stdout=out, stderr=out)
        chief_log = logs["chief-0"]
        assert wait_exit(procs["chief-0"], 240, chief_log) == 0, read(chief_log)[-3000:]
        out = read(chief_log)
        assert re.search(rf"^training started: strategy=ps step=0 train_steps={STEPS} "
                         r"model=mlp replicas=1 ", out, re.M), out[-3000:]
        assert re.search(rf"^training finished: step={STEPS} ", out, re.M), out[-3000:]
        assert os.path.exists(os.path.join(job_dir, "model", "saved_model.pb"))
        for pod, fqdn in (("worker-0", "job01-worker-0-0.job01"),
                          ("ps-0", "job01-ps-0-0.job01")):
            kind, index = pod.split("-")
            assert f"serving {kind} {index} at {fqdn}:2222" in read(logs[pod]), \
                read(logs[pod])[-3000:]

        # The chief's Job completed: the success policy ends the JobSet, whose
        # controller deletes the Jobs still running; the kubelet sends SIGTERM.
        servers = [procs["worker-0"], procs["ps-0"]]
        assert [p.poll() for p in servers] == [None, None]
        for proc in servers:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc, pod in zip(servers, ("worker-0", "ps-0")):
            assert wait_exit(proc, 30, logs[pod]) == 143
    assert not any(pid_alive(p.pid) for p in procs.values())
    assert not set(names) & set(list_namespaces())
    assert not any(os.path.exists(folder) for folder in etc)
