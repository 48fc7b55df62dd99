"""The model server as a Vertex AI custom serving container, end to end: started the way
Vertex starts one (the image's `tensorflow_model_server` entrypoint, with Vertex's
AIP_HTTP_PORT, AIP_HEALTH_ROUTE, AIP_PREDICT_ROUTE and AIP_STORAGE_URI pointing at a
`gs://` copy of the export on the real GCS emulator, the local export deleted), then
called as Vertex calls it: health on its route until 200, and predictions with the body
of Vertex's own PredictRequest, the answer read as Vertex's PredictResponse."""
import os
import select
import shutil
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from mljob import storage
from tests.support.common import free_ports
from tests.support.predict_models import images, saved_model_export

pytestmark = pytest.mark.slow

ENDPOINT = "/v1/endpoints/4242/deployedModels/777"  # the shape of Vertex's own routes
ENTRYPOINT = "import sys; from predict.serving.process import main_model_server; " \
             "sys.exit(main_model_server())"


def _started(proc, timeout=240.0) -> list:
    deadline, lines = time.time() + timeout, []
    while time.time() < deadline and proc.poll() is None:
        if select.select([proc.stdout], [], [], 0.5)[0]:
            # the ready lines come in one write: once the first is here, so are the others
            while line := proc.stdout.readline():
                lines.append(line)
                if line.startswith("serving gRPC at "):
                    return lines
    raise AssertionError(f"not ready: {lines} {proc.stderr.read() if proc.poll() else ''}")


def test_vertex_starts_and_calls_the_container(gcs_emulator, tmp_path, reaper):
    from google.cloud import aiplatform_v1
    from google.protobuf import json_format

    from predict.runtime import model as models
    # the body Vertex forwards to the route: its PredictRequest's instances and parameters
    imgs = images(3, seed=5)
    request = aiplatform_v1.PredictRequest()._pb
    json_format.ParseDict({"instances": [{"image": img.tolist()} for img in imgs],
                           "parameters": {}}, request)
    body = json_format.MessageToDict(request)
    assert set(body) == {"instances", "parameters"}
    local = saved_model_export(str(tmp_path / "export"), seed=11)
    direct = models.load(local)
    uri = "gs://mljob-test/vertex/fashion/model"  # what --artifact-uri is copied to
    storage.upload_tree(local, uri)
    shutil.rmtree(local)  # the container can only have it from GCS

    http_port, grpc_port = free_ports(2)
    env = {**os.environ, "AIP_HTTP_PORT": str(http_port), "AIP_HEALTH_ROUTE": ENDPOINT,
           "AIP_PREDICT_ROUTE": f"{ENDPOINT}:predict", "AIP_STORAGE_URI": uri}
    # the image's ENTRYPOINT ["tensorflow_model_server"]; --port only keeps gRPC off
    # 8500, which this shared machine's other servers may hold
    proc = reaper.popen([sys.executable, "-c", ENTRYPOINT, f"--port={grpc_port}"],
                        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready = _started(proc)
    assert ready[0] == f"serving model default at http://0.0.0.0:{http_port}" \
                       "/v1/models/default\n", ready  # on every interface, as Vertex needs

    with httpx.Client(base_url=f"http://127.0.0.1:{http_port}", timeout=60) as client:
        health = client.get(ENDPOINT)
        assert health.status_code == 200, health.text
        assert health.json() == {"status": "SERVING", "models": {"default": ["1"]}}

        answer = client.post(f"{ENDPOINT}:predict", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"] == "application/json"
        assert list(answer.json()) == ["predictions"]
        response = aiplatform_v1.PredictResponse()
        json_format.Parse(answer.text, response._pb)  # Vertex's own type reads it
        predictions = [dict(p) for p in response.predictions]
        assert [sorted(p) for p in predictions] == [["classes", "scores"]] * 3  # no key sent
        want = direct.predict({"image": imgs, "key": np.zeros(3, np.int64)})
        np.testing.assert_allclose([list(p["scores"]) for p in predictions], want["scores"],
                                   rtol=1e-5)
        assert [int(p["classes"]) for p in predictions] == want["classes"].tolist()

        # Vertex's parameters have no place in a SavedModel signature: a one-line 400
        refused = client.post(f"{ENDPOINT}:predict", json={**body, "parameters": {"k": 1}})
        assert refused.status_code == 400 and "takes no parameters" in refused.json()["error"]
        # the container still answers TF Serving's own API beside Vertex's routes
        assert client.get("/v1/models/default").json()["model_version_status"][0][
            "state"] == "AVAILABLE"
    reaper.stop(proc)
    err = proc.stderr.read()
    assert f"model default: loading version 1 from {uri}" in err, err
