"""TF Serving's Docker command lines, unchanged, against the `tensorflow_model_server`
console script that pip installs from this project: the image runs
`tensorflow_model_server --port=8500 --rest_api_port=8501 --model_name=${MODEL_NAME}
--model_base_path=${MODEL_BASE_PATH}/${MODEL_NAME}` and reads MODEL_NAME (and
MODEL_BASE_PATH) from `docker run -e`. The server runs on its own test host (a network
namespace, so TF Serving's fixed ports 8500/8501 are its own), listening on 0.0.0.0 as
TF Serving does, and a client on another host calls it with TF Serving's stubs."""
import json
import os
import select
import subprocess
import sys
import time

import pytest

from tests.support.netns import test_hosts
from tests.support.predict_models import images, saved_model_export

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CLIENT = r"""
import json, sys
import grpc, httpx, numpy as np, tensorflow as tf
from grpc_health.v1 import health_pb2, health_pb2_grpc
from predict.serving_api.apis import predict_pb2, prediction_service_pb2_grpc
host, name = sys.argv[1], sys.argv[2]
imgs = np.asarray(json.loads(sys.argv[3]), np.float32)
out = {}
rest = httpx.post(f"http://{host}:8501/v1/models/{name}:predict", timeout=60,
                  json={"instances": [{"image": i.tolist(), "key": k} for k, i in enumerate(imgs)]})
out["rest"] = [rest.status_code, rest.json()]
out["metrics"] = httpx.get(f"http://{host}:8501/monitoring/prometheus/metrics").status_code
with grpc.insecure_channel(f"{host}:8500") as channel:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.inputs["image"].CopyFrom(tf.make_tensor_proto(imgs))
    request.inputs["key"].CopyFrom(tf.make_tensor_proto(np.arange(len(imgs), dtype=np.int64)))
    answer = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=60)
    out["grpc"] = tf.make_ndarray(answer.outputs["scores"]).tolist()
    check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
    out["health"] = health_pb2.HealthCheckResponse.ServingStatus.Name(check.status)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """This project pip-installed (without dependencies) into a folder of its own:
    its bin/tensorflow_model_server is the console script users get."""
    target = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--no-build-isolation", "--target", str(target), ROOT],
                          capture_output=True, text=True, timeout=600, cwd=str(target))
    assert done.returncode == 0, done.stderr[-2000:]
    script = target / "bin" / "tensorflow_model_server"
    assert script.exists()
    return target, script


def _ready(proc, timeout=240.0) -> str:
    deadline, lines = time.time() + timeout, []
    while time.time() < deadline:
        if select.select([proc.stdout], [], [], 0.5)[0]:
            # the ready lines come in one write: once the first is here, so are the others
            while True:
                line = proc.stdout.readline()
                lines.append(line)
                if not line or line.startswith("serving gRPC at "):
                    break
            if line.startswith("serving gRPC at "):
                return "".join(lines)
            if proc.poll() is not None:
                break
    raise AssertionError(f"not ready: {lines} {proc.stderr.read() if proc.poll() else ''}")


def test_the_docker_images_command_lines_run_unchanged(installed, tmp_path, reaper):
    site, script = installed
    models = tmp_path / "models"
    saved_model_export(str(models / "half_plus_two" / "1"))
    imgs = images(2, seed=3)
    env = {**os.environ, "PYTHONPATH": str(site)}  # the installed copy, not this tree
    env.pop("MODEL_NAME", None)
    image_env = {**env, "MODEL_NAME": "half_plus_two", "MODEL_BASE_PATH": str(models)}
    runs = [  # the image's entrypoint, verbatim; then the image's environment alone
        ([str(script), "--port=8500", "--rest_api_port=8501", "--model_name=half_plus_two",
          f"--model_base_path={models}/half_plus_two"], env),
        ([str(script)], image_env)]
    with test_hosts(2, reaper) as hosts:
        for args, run_env in runs:
            server = hosts[0].popen(args, env=run_env, cwd=str(tmp_path),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
            lines = _ready(server)
            assert "serving model half_plus_two at http://0.0.0.0:8501/" in lines
            assert "serving gRPC at 0.0.0.0:8500" in lines
            client = hosts[1].run([sys.executable, "-c", CLIENT, hosts[0].address,
                                   "half_plus_two", json.dumps(imgs.tolist())],
                                  timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
            assert client.returncode == 0, client.stderr[-3000:]
            out = json.loads(client.stdout.strip().splitlines()[-1])
            assert out["rest"][0] == 200 and len(out["rest"][1]["predictions"]) == 2
            rest_scores = [p["scores"] for p in out["rest"][1]["predictions"]]
            assert max(abs(a - b) for r, g in zip(rest_scores, out["grpc"], strict=True)
                       for a, b in zip(r, g, strict=True)) < 1e-6
            assert out["health"] == "SERVING"
            assert out["metrics"] == 404  # TF Serving: no metrics without a monitoring config
            server.terminate()
            assert server.wait(60) == 0
