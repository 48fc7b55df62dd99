"""`--runner ray`: the job on a Ray cluster, through Ray's job submission API (the
dashboard's job API at `--ray-address`, default `$RAY_ADDRESS`: `http://HEAD:8265`).

The Ray job's entrypoint is mljob's driver (`submit.runners.ray_driver`, see there for
what runs inside the cluster: the placement group, one actor per replica, TF_CONFIG from
the addresses Ray placed them at, restarts, ps stopped when the chief ends). This module
renders the job (pure), checks the cluster can take it, and submits, reads, follows and
stops it:

- runtime_env: `working_dir` is a folder holding the driver, `job.json` (what `--dry-run`
  prints under `job`) and the staged archives (downloaded from their staged URLs, their
  hashes checked), which Ray uploads to the cluster; `pip` installs those archives (the
  sdist the package step built, `--packages`, mljob's core) from the working dir on every
  node, into a virtualenv that sees the node's own packages (TensorFlow, Ray). Each
  archive sits in a folder named by its hash, so Ray's environment cache (keyed by the
  pip list) never serves an older build of the same version.
- Cloud ML's fields: the replica counts and machine types become the placement group's
  bundles (mljob.machines: vCPUs, memory, GPUs); restartPolicy/maxRestarts per type,
  scheduling.maxRunningTime and maxWaitTime (how long the placement group may wait for
  room) are the driver's; args, pythonModule, useChiefInTfConfig and the job's
  trainingInput (TF_CONFIG's `job`) as on every runner; region and runtimeVersion are
  recorded only; labels are the Ray job's metadata.
- status and logs: Ray's job status (PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED) as the
  record's states; the Ray job's log is the job's log (the driver prints every line in
  the local runner's format), and the replicas' states are the driver's service lines.

A tuning job (`trainingInput.hyperparameters`) is `submit.runners.ray_tuning`'s: the
study runs here, each trial a Ray job rendered by this module (the registry,
`submit.runners.TUNING`, picks it for a tuning job).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from ray.job_submission import JobStatus, JobSubmissionClient

from mljob import contracts, machines, storage
from submit import jobs as records
from submit import logs as logfmt
from submit.packaging import package as packages
from submit.jobdef import spec as specs
from submit.errors import SubmitError, UsageError
from submit.packaging.package import Package
from submit.runners import ray_driver
from submit.runners.engine import ClusterEngine, EngineStatus, Rendered, ReplicaStatus

ADDRESS_ENV = "RAY_ADDRESS"
CONNECT_TIMEOUT_S = 5.0
POLL_S = 1.0
CANCEL_WAIT_S = 90.0  # the driver's ordered stop: the chief saves first
FOLLOW_OUTAGE_S = 120.0  # how long a followed job's dashboard may not answer
DRIVER_FILE = "ray_driver.py"
JOB_FILE = "job.json"
GIB = 1024 ** 3
STATES = {JobStatus.PENDING: records.QUEUED, JobStatus.RUNNING: records.RUNNING,
          JobStatus.STOPPED: records.CANCELLED, JobStatus.SUCCEEDED: records.SUCCEEDED,
          JobStatus.FAILED: records.FAILED}
_HOST_PORT = re.compile(r"[A-Za-z0-9.\-]+:[0-9]{1,5}|\[[0-9A-Fa-f:]+\]:[0-9]{1,5}")


def dashboard_url(given: str | None) -> str:
    """The job API's URL from --ray-address or $RAY_ADDRESS; UsageError naming the fix."""
    where = "--ray-address" if given is not None else f"${ADDRESS_ENV}"
    address = given if given is not None else os.environ.get(ADDRESS_ENV)
    if not address:
        raise UsageError(f"--runner ray needs the Ray cluster's dashboard address: pass "
                         f"--ray-address http://HEAD:8265 or set {ADDRESS_ENV}")
    specs.check_text(address, where)
    if "://" not in address:
        address = "http://" + address
    parts = urlsplit(address)
    if parts.scheme not in ("http", "https") or not _HOST_PORT.fullmatch(parts.netloc) \
            or parts.path.strip("/") or parts.query:
        raise UsageError(f"{where} {address!r:.80} is not a Ray dashboard address; give "
                         "http://HOST:PORT (the head's dashboard, 8265 by default; not "
                         "the ray:// client or the GCS port)")
    return f"{parts.scheme}://{parts.netloc}"


def bundle(group: specs.ReplicaGroup) -> dict[str, float]:
    """A replica's placement group bundle: its machine type's vCPUs, memory and GPUs."""
    machine = machines.lookup(group.machine_type)
    out = {"CPU": float(machine.vcpus), "memory": float(int(machine.memory_gib * GIB))}
    if group.gpus:
        out["GPU"] = float(group.gpus)
    return out


class RayEngine(ClusterEngine):
    name = "ray"

    def check(self, spec: specs.JobSpec) -> None:
        super().check(spec)
        dashboard_url(self.options.ray_address)
        if any(g.image_uri for g in spec.groups):
            raise UsageError("custom containers (imageUri) run on --runner kubeflow or "
                             "vertex; --runner ray installs Python packages: drop the image "
                             "and give --package-path")
        if spec.job_dir and spec.job_dir.startswith("memory://"):
            raise UsageError("--runner ray cannot use a memory:// job dir: replicas run on "
                             "the cluster's nodes; use gs://BUCKET/PATH or a folder every "
                             "node shares")

    def render(self, spec: specs.JobSpec, package: Package | None) -> Rendered:
        assert package is not None  # check() refused custom containers
        address = dashboard_url(self.options.ray_address)
        order = [specs.CHIEF, specs.WORKER, specs.PS, specs.EVALUATOR]
        chief = specs.CHIEF if spec.use_chief else specs.MASTER
        replicas = []
        for task_type in order:
            group = spec.group(task_type)
            for index in range(spec.count(task_type)):
                assert group is not None
                replicas.append({
                    "label": contracts.replica_label(task_type, index),
                    "task_type": chief if task_type == specs.CHIEF else task_type,
                    "index": index, "is_chief": task_type == specs.CHIEF,
                    "bundle": bundle(group), "machine_type": group.machine_type,
                    "restart_policy": group.restart_policy,
                    "max_restarts": group.max_restarts})
        env = {"PYTHONPATH": "", "PYTHONUNBUFFERED": "1", "GRPC_FAIL_FAST": "use_caller",
               contracts.JOB_ID_ENV: spec.job_id, **logfmt.quiet_env({})}
        archives = [{"file_name": p.file_name, "sha256": p.sha256, "url": p.url}
                    for p in package.all]
        job = {"job_id": spec.job_id, "module": spec.module_name,
               "args": list(spec.trainer_args), "env": env,
               "training_input": dict(spec.training_input), "replicas": replicas,
               "spread": spec.count(specs.PS) > 0,
               "max_running_time": spec.max_running_time,
               "max_wait_time": spec.max_wait_time,
               "patterns": {"glog": logfmt.GLOG.pattern, "python": logfmt.PYTHON_LOG.pattern,
                            "error": logfmt.ERROR_LINE.pattern,
                            **({"quiet": logfmt.STARTUP_NOISE.pattern}
                               if env.get(logfmt.TF_LOG_LEVEL_ENV) else {})}}
        # `ray job stop` SIGKILLs the driver after RAY_JOB_STOP_WAIT_TIME_S (3 s by
        # default): long enough here for the driver's ordered stop (chief saving first)
        stop_wait = ray_driver.stop_deadline(env) + 4 * ray_driver.STOP_GRACE_S
        runtime_env = {"working_dir": "(a folder: the driver, job.json and the archives)",
                       "pip": {"packages": [_pip_path(a) for a in archives],
                               "pip_check": False},
                       "env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": f"{stop_wait:g}"}}
        body = {"address": address, "entrypoint": f"python {DRIVER_FILE} {JOB_FILE}",
                "runtime_env": runtime_env, "metadata": _metadata(spec),
                "archives": archives, "job": job}
        handle = {"address": address, "job_id": spec.job_id}
        return Rendered(body=body, text=json.dumps(body, indent=2, sort_keys=True),
                        handle=handle)

    @staticmethod
    def _fits(rendered: Rendered) -> None:
        """The cluster answers and can place the job's bundles: else one line, before
        anything is staged (never a job left waiting for what never comes)."""
        address = rendered.body["address"]
        nodes = _nodes(_client(address), address)
        job = rendered.body["job"]
        try:
            ray_driver.fit([r["bundle"] for r in job["replicas"]], nodes, job["spread"])
        except ValueError as exc:
            raise UsageError(f"{exc} ({address})") from None

    preflight = _fits

    def create(self, rendered: Rendered) -> Mapping[str, Any]:
        body = rendered.body
        handle = dict(rendered.handle)
        client = _client(handle["address"])
        submission_id = f"mljob-{body['job']['job_id']}-{uuid.uuid4().hex[:6]}"
        with tempfile.TemporaryDirectory(prefix="mljob-ray-") as folder:
            shutil.copy(ray_driver.__file__, os.path.join(folder, DRIVER_FILE))
            with open(os.path.join(folder, JOB_FILE), "w", encoding="utf-8") as f:
                json.dump(body["job"], f, indent=1, sort_keys=True)
            for archive in body["archives"]:
                _download(archive, folder)
            runtime_env = {**body["runtime_env"], "working_dir": folder}
            try:
                client.submit_job(entrypoint=body["entrypoint"], runtime_env=runtime_env,
                                  submission_id=submission_id, metadata=body["metadata"])
            except Exception as exc:  # the SDK raises RuntimeError & co.
                raise SubmitError(f"the Ray cluster at {handle['address']} refused the "
                                  f"job: {_one_line(exc)}") from None
        handle["submission_id"] = submission_id
        return handle

    def status(self, handle: Mapping[str, Any]) -> EngineStatus:
        client = _client(handle["address"])
        try:
            info = client.get_job_info(handle["submission_id"])
        except Exception as exc:
            if "does not exist" in str(exc):
                return EngineStatus(records.CANCELLED, f"the Ray job "
                                    f"{handle['submission_id']} is gone from the cluster")
            raise SubmitError(f"cannot read the Ray job {handle['submission_id']}: "
                              f"{_one_line(exc)}") from None
        state = STATES.get(info.status, records.QUEUED)
        text = _get_logs(client, handle)
        replicas, result = _replicas(text)
        message = None
        if state == records.FAILED:
            message = (result[1] if result and result[1] else
                       _one_line(info.message or "the Ray job failed"))
        return EngineStatus(state, message, replicas)

    def logs(self, handle: Mapping[str, Any], *, task_name: str | None = None,
             follow: bool = True) -> Iterator[str]:
        if task_name and contracts.parse_label(task_name) is None and \
                task_name != logfmt.SERVICE:
            raise UsageError(f"--task-name {task_name!r:.60} names no replica; use "
                             f"{contracts.LABEL_HINT}, or {logfmt.SERVICE}")
        client = _client(handle["address"])
        seen = 0
        failing_since = None
        while True:
            try:
                done = not follow or STATES.get(_job_status(client, handle)) in \
                    records.FINAL_STATES
                text = _get_logs(client, handle)
                failing_since = None
            except SubmitError:
                # a dashboard busy or restarting: following goes on for a while
                failing_since = failing_since or time.monotonic()
                if not follow or time.monotonic() - failing_since > FOLLOW_OUTAGE_S:
                    raise
                time.sleep(POLL_S)
                continue
            cut = text.rfind("\n", seen) + 1 if not done else len(text)
            for line in text[seen:cut].splitlines():
                if task_name is None or line.split("\t", 3)[2:3] == [task_name]:
                    yield line
            seen = max(seen, cut)
            if done:
                return
            time.sleep(POLL_S)

    def cancel(self, handle: Mapping[str, Any]) -> str:
        client = _client(handle["address"])
        try:
            client.stop_job(handle["submission_id"])
        except Exception as exc:
            if "does not exist" in str(exc):
                return records.CANCELLED
            raise SubmitError(f"cannot stop the Ray job {handle['submission_id']}: "
                              f"{_one_line(exc)}") from None
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline:
            if _job_status(client, handle) in (JobStatus.STOPPED, JobStatus.FAILED,
                                               JobStatus.SUCCEEDED):
                return records.CANCELLED
            time.sleep(0.5)
        return records.CANCELLING


def _metadata(spec: specs.JobSpec) -> dict[str, str]:
    return {"mljob_job_id": spec.job_id, "scale_tier": spec.scale_tier,
            **{f"label_{k}": v for k, v in spec.labels.items()}}


def _pip_path(archive: Mapping[str, Any]) -> str:
    return ("${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/packages/"
            f"{archive['sha256']}/{archive['file_name']}")


def _download(archive: Mapping[str, Any], folder: str) -> None:
    """The staged archive into the working dir, its hash checked."""
    out = os.path.join(folder, "packages", archive["sha256"])
    os.makedirs(out)
    if storage.is_local(archive["url"]):
        got = packages.describe(shutil.copy(storage.local_path(archive["url"]), out))
    else:
        got = packages.fetch(archive["url"], out)
    if got.sha256 != archive["sha256"]:
        raise SubmitError(f"the staged package {archive['url']} changed since it was "
                          "built (its hash differs); submit the job again")


def _client(address: str) -> JobSubmissionClient:
    """The job API's client, after a short check that the address answers as a Ray
    dashboard (the SDK's own requests have no timeout: an address that drops packets,
    or a server that never answers, would hang them)."""
    request = urllib.request.Request(f"{address}/api/version", headers=_auth_headers())
    try:
        with urllib.request.urlopen(request, timeout=CONNECT_TIMEOUT_S) as reply:
            version = json.load(reply).get("ray_version")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(exc, urllib.error.HTTPError) and exc.code in (401, 403):
            raise SubmitError(f"the Ray cluster at {address} asks for its authentication "
                              f"token ({exc.code} {exc.reason}); set RAY_AUTH_MODE=token "
                              "and give the cluster's token (RAY_AUTH_TOKEN, or "
                              "~/.ray/auth_token) as for `ray job submit`") from None
        if isinstance(exc, urllib.error.HTTPError) or isinstance(reason, socket.timeout) \
                or "timed out" in str(reason):
            raise SubmitError(f"{address} does not answer as a Ray dashboard's job API "
                              f"({_one_line(reason)}); check --ray-address (or "
                              f"{ADDRESS_ENV}) names the head's dashboard port") from None
        raise SubmitError(f"cannot reach the Ray cluster's dashboard at {address} "
                          f"({_one_line(reason)}); check the head is up and --ray-address "
                          f"(or {ADDRESS_ENV}) names its dashboard port") from None
    except ValueError:
        version = None
    if not version:
        raise SubmitError(f"{address} does not answer as a Ray dashboard's job API (no "
                          f"ray_version at /api/version); check --ray-address (or "
                          f"{ADDRESS_ENV})")
    try:
        return JobSubmissionClient(address)
    except Exception as exc:  # ConnectionError, RuntimeError, ...
        raise SubmitError(f"{address} does not answer as a Ray dashboard's job API "
                          f"({_one_line(exc)}); check --ray-address (or "
                          f"{ADDRESS_ENV})") from None


def _auth_headers() -> dict[str, str]:
    """Ray's token header when token authentication is on here (RAY_AUTH_MODE=token),
    as the SDK's client adds it to its own requests."""
    try:
        from ray._private.authentication.http_token_authentication import \
            get_auth_headers_if_auth_enabled
    except ImportError:   # a Ray without token authentication
        return {}
    try:
        return dict(get_auth_headers_if_auth_enabled({}))
    except Exception:     # no token: the dashboard's 401 says so
        return {}


def _nodes(client: JobSubmissionClient, address: str) -> list[dict]:
    """The alive nodes' total resources, from the dashboard's node summary."""
    try:
        reply = client._do_request("GET", "/nodes?view=summary")
        reply.raise_for_status()
        summary = reply.json()["data"]["summary"]
    except Exception as exc:
        raise SubmitError(f"cannot list the Ray cluster's nodes at {address}: "
                          f"{_one_line(exc)}") from None
    nodes = []
    for node in summary:
        raylet = node.get("raylet") or {}
        if raylet.get("state") == "ALIVE":
            nodes.append({k: float(v) for k, v in
                          (raylet.get("resourcesTotal") or {}).items()
                          if k in ("CPU", "GPU", "memory")})
    return nodes


def _job_status(client: JobSubmissionClient, handle: Mapping[str, Any]):
    try:
        return client.get_job_status(handle["submission_id"])
    except Exception as exc:
        raise SubmitError(f"cannot read the Ray job {handle['submission_id']}: "
                          f"{_one_line(exc)}") from None


def _get_logs(client: JobSubmissionClient, handle: Mapping[str, Any]) -> str:
    try:
        return client.get_job_logs(handle["submission_id"])
    except Exception as exc:
        raise SubmitError(f"cannot read the Ray job's log: {_one_line(exc)}") from None


def _replicas(text: str) -> tuple[tuple[ReplicaStatus, ...], tuple | None]:
    """The replicas' last states and the job's result, from the driver's service lines."""
    last: dict[str, dict] = {}
    result = None
    for line in text.splitlines():
        event = parse_event(line)
        if event:
            last[event[0]] = event[1]
        elif parse_result(line):
            result = parse_result(line)
    states = tuple(ReplicaStatus(label, f.get("state", "?"),
                                 None if f.get("exit", "-") == "-" else int(f["exit"]),
                                 int(f.get("restarts", 0)))
                   for label, f in last.items())
    return states, result


def _one_line(exc: BaseException | str) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


# --- the lines the driver prints (ray_driver.log_line), read back -----------------------

def _service(line: str, prefix: str) -> str | None:
    """The text after `prefix` of a driver's service line, else None."""
    parts = line.split("\t", 3)
    if len(parts) != 4 or parts[2] != ray_driver.SERVICE or not parts[3].startswith(prefix):
        return None
    return parts[3][len(prefix):]


def parse_event(line: str) -> tuple[str, dict] | None:
    """(label, fields) of a driver's replica event line, else None."""
    text = _service(line, ray_driver.EVENT)
    if text is None:
        return None
    label, *rest = text.split()
    return label, dict(item.split("=", 1) for item in rest if "=" in item)


def parse_result(line: str) -> tuple[str, str | None] | None:
    text = _service(line, ray_driver.RESULT)
    if text is None:
        return None
    state, _, why = text.partition(": ")
    return state.strip(), why or None


def parse_metric(line: str) -> tuple[str, str] | None:
    """(replica label, the report's JSON line) of a driver's relayed report, else None."""
    text = _service(line, ray_driver.METRIC)
    if text is None:
        return None
    label, _, report = text.partition(" ")
    return (label, report) if report else None
