"""A model version served from the Python API (`Model.deploy()`, as Vertex's SDK):
the local server started on 127.0.0.1 answers `predict(instances)` with what the
export's own signature computes, the version asked for is the one that answers, and the
server is stopped by its PID by `undeploy()`, by leaving a `with` block and when the
interpreter exits without either."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from mljob import procs
from submit import api
from tests.support.common import ROOT
from tests.support.predict_models import images, saved_model_export

pytestmark = pytest.mark.slow
IMAGES = images(3, seed=5)


def _gone(pid: int, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while procs.pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not procs.pid_alive(pid)


def test_deploy_predict_and_undeploy(tmp_path):
    import tensorflow as tf
    exports = {seed: saved_model_export(str(tmp_path / f"seed{seed}"), seed=seed)
               for seed in (1, 2)}
    want = {seed: tf.saved_model.load(path).signatures["serving_default"](
        image=tf.constant(IMAGES), key=tf.constant(np.arange(3), tf.int64))["scores"].numpy()
        for seed, path in exports.items()}
    model = api.create_model("deployed", base_path=str(tmp_path / "base"))
    with pytest.raises(api.UsageError, match="has no default version"):
        model.deploy()
    model.create_version("v1", exports[1])
    model.create_version("v2", exports[2])
    instances = [{"image": row.tolist(), "key": i} for i, row in enumerate(IMAGES)]

    with model.deploy() as endpoint:  # the default version: v1
        assert endpoint.serving and endpoint.url.startswith("http://127.0.0.1:")
        answer = endpoint.predict(instances)
        assert (answer.model_version_id, answer.deployed_model_id) == ("v1", "deployed:v1")
        scores = np.array([row["scores"] for row in answer.predictions])
        np.testing.assert_allclose(scores, want[1], rtol=1e-5, atol=1e-7)
        assert [row["key"] for row in answer.predictions] == [0, 1, 2]
        with pytest.raises(api.UsageError, match="refused the instances"):
            endpoint.predict([{"picture": [0.0]}])
        pid = endpoint.pid
    assert _gone(pid) and not endpoint.serving
    with pytest.raises(api.UsageError, match="is not serving"):
        endpoint.predict(instances)

    endpoint = model.deploy("v2")
    try:
        scores = np.array([row["scores"] for row in endpoint.predict(instances).predictions])
        np.testing.assert_allclose(scores, want[2], rtol=1e-5, atol=1e-7)
    finally:
        endpoint.undeploy()
    assert _gone(endpoint.pid)
    endpoint.undeploy()  # twice: nothing


def test_a_server_left_deployed_stops_when_the_interpreter_exits(tmp_path):
    export = saved_model_export(str(tmp_path / "export"), seed=3)
    script = ("from submit import api\n"
              f"m = api.create_model('left', base_path={str(tmp_path / 'base')!r})\n"
              f"m.create_version('v1', {export!r})\n"
              "e = m.deploy()\nprint(e.pid, flush=True)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[-1])
    try:
        assert _gone(pid, timeout=5)
    finally:  # a server the interpreter's exit failed to stop is stopped here, by its PID
        if not _gone(pid, timeout=0):
            os.kill(pid, signal.SIGKILL)
