"""A model version served on this machine for the Python API, as Vertex's SDK serves
one (`endpoint = model.deploy()`, `endpoint.predict(instances=[...]).predictions`,
`endpoint.undeploy()`): the local TF Serving-compatible server (`python -m predict
serve --model_dir VERSION_FOLDER`) in a process of its own on 127.0.0.1, its REST API
asked with TF Serving's request (`{"instances": [...]}` to
`/v1/models/MODEL:predict`).

The server runs in its own session and is stopped by its PID (SIGTERM, then SIGKILL of
its group after STOP_GRACE_S) by `undeploy()`, by leaving a `with` block, and, for any
left running, when the interpreter exits. Its output goes to a log file
(`Endpoint.log_path`) whose last line names the cause when it cannot start.
"""
from __future__ import annotations

import atexit
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from mljob import procs
from submit.errors import SubmitError, UsageError

STOP_GRACE_S = 10.0
POLL_S = 0.25
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_live: set[Endpoint] = set()
_live_lock = threading.Lock()


@dataclasses.dataclass
class Prediction:
    """An answer, as Vertex's `Endpoint.predict` gives it: `predictions` (one per
    instance, TF Serving's row format), the model and version that answered."""

    predictions: list[Any]
    deployed_model_id: str
    model_version_id: str


class Endpoint:
    """A version being served (see the module docstring); made by `Model.deploy()`."""

    def __init__(self, model: str, version: str, deployment_uri: str, *,
                 port: int | None = None, timeout: float = 300.0):
        self.model = model
        self.version = version
        self.deployment_uri = deployment_uri
        rest, grpc = procs.free_ports(2)
        self.port = port or rest
        self.url = f"http://127.0.0.1:{self.port}"
        fd, self.log_path = tempfile.mkstemp(prefix=f"mljob-endpoint-{model}-",
                                             suffix=".log")
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
        with os.fdopen(fd, "ab") as log:
            self.process: subprocess.Popen | None = subprocess.Popen(
                [sys.executable, "-m", "predict", "serve", "--model_dir", deployment_uri,
                 "--model_name", model, "--rest_api_port", str(self.port),
                 "--port", str(grpc), "--host", "127.0.0.1"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True)
        self.pid = self.process.pid
        with _live_lock:
            _live.add(self)
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.undeploy()
            raise

    def __repr__(self) -> str:
        state = "serving" if self.serving else "stopped"
        return f"Endpoint({self.model!r}, version={self.version!r}, {self.url}, {state})"

    def __enter__(self) -> Endpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undeploy()

    @property
    def serving(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _last_line(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - 4096))
                lines = [ln for ln in f.read().decode(errors="replace").splitlines()
                         if ln.strip()]
        except OSError:
            return ""
        return lines[-1].strip()[:300] if lines else ""

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        status_url = f"{self.url}/v1/models/{self.model}"
        while time.monotonic() < deadline:
            if not self.serving:
                raise SubmitError(f"the server of {self.model} {self.version} ended before "
                                  f"it served: {self._last_line() or 'no output'} (see "
                                  f"{self.log_path})")
            try:
                with urllib.request.urlopen(status_url, timeout=5) as answer:
                    status = json.loads(answer.read())
                if any(s.get("state") == "AVAILABLE"
                       for s in status.get("model_version_status", [])):
                    return
            except (OSError, ValueError):
                pass  # not listening yet
            time.sleep(POLL_S)
        raise SubmitError(f"the server of {self.model} {self.version} was not serving "
                          f"after {timeout:g} s (see {self.log_path})")

    def predict(self, instances: Sequence[Any], *,
                signature_name: str | None = None) -> Prediction:
        """The version's answers to `instances` (a list: one value or dict of named
        inputs each, as `gcloud ai-platform predict --json-instances` reads them)."""
        if not self.serving:
            raise UsageError(f"the endpoint of {self.model} {self.version} is not serving "
                             "(undeployed, or its server ended); deploy it again")
        body: dict[str, Any] = {"instances": list(instances)}
        if signature_name is not None:
            body["signature_name"] = signature_name
        request = urllib.request.Request(
            f"{self.url}/v1/models/{self.model}:predict", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=300) as answer:
                data = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            try:
                error = json.loads(exc.read()).get("error") or exc.reason
            except ValueError:
                error = exc.reason
            text = " ".join(str(error).split())[:300]
            if 400 <= exc.code < 500:
                raise UsageError(f"{self.model} {self.version} refused the instances: "
                                 f"{text}") from None
            raise SubmitError(f"{self.model} {self.version} failed: {text}") from None
        except OSError as exc:
            raise SubmitError(f"the server of {self.model} {self.version} did not "
                              f"answer: {exc} (see {self.log_path})") from None
        return Prediction(predictions=data.get("predictions", data.get("outputs")),
                          deployed_model_id=f"{self.model}:{self.version}",
                          model_version_id=self.version)

    def undeploy(self) -> None:
        """Stop the server (by its PID; its whole session); nothing if already done."""
        process, self.process = self.process, None
        with _live_lock:
            _live.discard(self)
        if process is not None:
            procs.stop_process(process, STOP_GRACE_S)


@atexit.register
def _undeploy_all() -> None:
    """Every endpoint still serving when the interpreter exits is stopped."""
    with _live_lock:
        left = list(_live)
    for endpoint in left:
        endpoint.undeploy()
