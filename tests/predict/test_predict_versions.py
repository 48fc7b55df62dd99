"""`python -m predict serve --model-base-path`: numbered versions, policies, labels, the
watcher (local folders and gs:// on the GCS emulator), several models from a config
file, and hot swaps under 100 concurrent real HTTP clients."""
import asyncio
import os
import shutil
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import psutil
import pytest
import tensorflow as tf

from predict.models import config as model_config
from predict.errors import UsageError
from predict.models.repository import Repository
from predict.models.versions import ModelConfig, VersionPolicy, scan_versions
from tests.support.predict_models import (images, metric_samples, publish_version,
                                          saved_model_export, start_server, states,
                                          wait_for_status)

MODEL = "/v1/models/default"
IMAGES = images(4, seed=21)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Four exports with different weights, so an answer tells which version gave it."""
    root = tmp_path_factory.mktemp("versions")
    return {seed: saved_model_export(str(root / f"seed{seed}"), seed=seed)
            for seed in (1, 2, 3, 4)}


@pytest.fixture(scope="module")
def expected(exports):
    """{seed: scores of IMAGES} computed in-process with the signature itself."""
    out = {}
    for seed, path in exports.items():
        fn = tf.saved_model.load(path).signatures["serving_default"]
        out[seed] = fn(image=tf.constant(IMAGES),
                       key=tf.constant(np.arange(4), tf.int64))["scores"].numpy()
    return out


def which(expected_scores: dict, index: int, scores) -> int | None:
    for seed, want in expected_scores.items():
        if np.allclose(scores, want[index], rtol=1e-5, atol=1e-7):
            return seed
    return None


# --- policies, scanning, config files (no server) --------------------------------------

def test_version_policies_choose_like_tf_serving():
    found = [1, 2, 5, 10]
    assert VersionPolicy.parse("latest").choose(found) == {10}
    assert VersionPolicy.parse("latest:2").choose(found) == {5, 10}
    assert VersionPolicy.parse("all").choose(found) == {1, 2, 5, 10}
    assert VersionPolicy.parse("specific:2,7").choose(found) == {2}
    for bad in ("latest:0", "newest", "specific:", "specific:a", "all:3"):
        with pytest.raises(UsageError, match="is not one of latest"):
            VersionPolicy.parse(bad)


def test_scan_counts_only_published_numbered_folders(tmp_path, exports, memfs):
    base = tmp_path / "base"
    publish_version(exports[1], str(base), 1)
    publish_version(exports[2], str(base), 12)
    (base / "3" / "variables").mkdir(parents=True)       # half-published: no marker
    shutil.copytree(exports[1], base / "latest")          # not a number
    shutil.copytree(exports[1], base / ".7.tmp-abcd")     # a publish in progress
    assert sorted(scan_versions(str(base))) == [1, 12]
    publish_version(exports[1], "memory://models/m", 4)
    memfs.pipe("/models/m/5/variables/variables.index", b"x")
    assert list(scan_versions("memory://models/m")) == [4]


def test_config_file_text_proto_and_yaml_agree(tmp_path):
    text = tmp_path / "models.config"
    text.write_text("""
model_config_list {
  config {
    name: "mnist"
    base_path: "models/mnist"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 1 versions: 3 } }
    version_labels { key: "stable" value: 1 }
    version_labels { key: "canary" value: 3 }
  }
  config { name: "other" base_path: "gs://bucket/other"
           model_version_policy { latest { num_versions: 2 } } }
}""")
    yaml_file = tmp_path / "models.yaml"
    yaml_file.write_text("""
model_config_list:
  config:
    - name: mnist
      base_path: models/mnist
      model_version_policy: {specific: {versions: [1, 3]}}
      version_labels: {stable: 1, canary: 3}
    - name: other
      base_path: gs://bucket/other
      model_version_policy: {latest: {num_versions: 2}}
""")
    want = [ModelConfig("mnist", base_path=str(tmp_path / "models/mnist"),
                        policy=VersionPolicy("specific", versions=frozenset({1, 3})),
                        labels={"stable": 1, "canary": 3}),
            ModelConfig("other", base_path="gs://bucket/other",
                        policy=VersionPolicy("latest", count=2))]
    assert model_config.read(str(text)) == want
    assert model_config.read(str(yaml_file)) == want


@pytest.mark.parametrize("name,text,words", [
    ("unknown field", "model_config_list:\n  config:\n    - {name: a, base_path: b, "
                      "basepath: c}\n", "unknown field 'basepath'"),
    ("no base path", "model_config_list:\n  config:\n    - {name: a}\n",
     "base_path is required"),
    ("bad policy", "model_config_list:\n  config:\n    - {name: a, base_path: b, "
                   "model_version_policy: {newest: {}}}\n", "model_version_policy must be"),
    ("bad label", "model_config_list:\n  config:\n    - {name: a, base_path: b, "
                  "version_labels: {stable: x}}\n", "version label 'stable' must name"),
    ("no models", "model_config_list: {}\n", "at least one config"),
    ("not yaml", "model_config_list: [\n", "not valid YAML"),
    ("other platform", "model_config_list:\n  config:\n    - {name: a, base_path: b, "
                       "model_platform: pytorch}\n", "model_platform 'pytorch'"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 20 else None)
def test_bad_config_files_name_the_problem(tmp_path, name, text, words):
    path = tmp_path / "models.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=words):
        model_config.read(str(path))


def test_bad_text_proto_and_duplicate_names(tmp_path):
    path = tmp_path / "models.config"
    path.write_text("model_config_list { config { nme: 'a' } }")
    with pytest.raises(UsageError, match="not a ModelServerConfig text proto"):
        model_config.read(str(path))
    with pytest.raises(UsageError, match="model name 'a' is given twice"):
        Repository([ModelConfig("a", base_path="x"), ModelConfig("a", base_path="y")])


def test_a_version_in_use_is_closed_only_after_its_last_request(tmp_path, exports):
    """Unloading waits for the requests that hold the old version (a legacy export's
    session would otherwise be closed under them)."""
    closed = []

    class Fake:
        def __init__(self, url):
            self.url = url

        def close(self):
            closed.append(self.url)

    base = tmp_path / "base"
    publish_version(exports[1], str(base), 1)
    repo = Repository([ModelConfig("m", base_path=str(base))], poll_seconds=0,
                      loader=Fake)
    repo.start()
    served = repo.get("m")
    with served.use() as (number, model):
        assert number == 1
        publish_version(exports[2], str(base), 2)
        served.poll()
        assert states(served.status()) == {2: "AVAILABLE", 1: "END"}
        with served.use() as (newer, _):
            assert newer == 2
        assert closed == []            # version 1 is still in use here
    assert closed == [model.url]


# --- a real server ------------------------------------------------------------------

def test_half_published_and_broken_versions_never_replace_a_good_one(
        tmp_path, exports, expected, reaper):
    base = tmp_path / "base"
    publish_version(exports[1], str(base), 1)
    proc, url = start_server(reaper.popen, str(base), "--file-system-poll-wait-seconds",
                             "0.2", "--max_num_load_retries=0", flag="--model-base-path")
    with httpx.Client(base_url=url, timeout=60) as client:
        (base / "5" / "variables").mkdir(parents=True)      # no saved_model.pb yet
        shutil.copytree(exports[2] + "/variables", base / "5" / "variables",
                        dirs_exist_ok=True)
        broken = base / ".4"
        shutil.copytree(exports[2], broken)
        (broken / "saved_model.pb").write_bytes(b"not a SavedModel")
        os.rename(broken, base / "4")
        status = wait_for_status(client, MODEL, lambda s: 4 in states(s))
        assert states(status) == {4: "END", 1: "AVAILABLE"}
        failed = status[0]
        assert failed["status"]["error_code"] != "OK" and failed["status"]["error_message"]
        time.sleep(1)  # several polls: folder 5 stays unloaded
        assert 5 not in states(client.get(MODEL).json()["model_version_status"])
        answer = client.post(f"{MODEL}:predict", json={"instances": [
            {"image": IMAGES[0].tolist(), "key": 0}]})
        assert answer.status_code == 200
        assert which(expected, 0, answer.json()["predictions"][0]["scores"]) == 1
        assert client.get(f"{MODEL}/versions/4").json()["model_version_status"][0][
            "state"] == "END"
        assert client.post(f"{MODEL}/versions/4:predict", json={"instances": [
            {"image": IMAGES[0].tolist(), "key": 0}]}).status_code == 404
        text = client.get("/monitoring/prometheus/metrics").text
        loads = metric_samples(text, ":tensorflow:cc:saved_model:load_attempt_count")
        assert loads == {frozenset({("model_path", str(base / "1")), ("status", "success")}): 1,
                         frozenset({("model_path", str(base / "4")), ("status", "fail")}): 1}
        assert metric_samples(text, ":mljob:serving:model_latest_version") == {
            frozenset({("model_name", "default")}): 1}


def test_policy_labels_and_version_paths(tmp_path, exports, expected, reaper):
    base = tmp_path / "base"
    for version, seed in ((1, 1), (2, 2), (3, 3)):
        publish_version(exports[seed], str(base), version)
    proc, url = start_server(reaper.popen, str(base), "--model-version-policy", "latest:2",
                             "--version-label", "stable=2", "--version-label", "canary=3",
                             "--model-name", "mnist", flag="--model-base-path")
    body = {"instances": [{"image": IMAGES[1].tolist(), "key": 1}]}
    with httpx.Client(base_url=url, timeout=60) as client:
        assert states(client.get("/v1/models/mnist").json()["model_version_status"]) == {
            3: "AVAILABLE", 2: "AVAILABLE"}
        for path, seed in (("/v1/models/mnist", 3), ("/v1/models/mnist/versions/2", 2),
                           ("/v1/models/mnist/labels/stable", 2),
                           ("/v1/models/mnist/labels/canary", 3)):
            answer = client.post(f"{path}:predict", json=body)
            assert answer.status_code == 200, answer.text
            assert which(expected, 1, answer.json()["predictions"][0]["scores"]) == seed
            meta = client.get(f"{path}/metadata").json()
            assert meta["model_spec"]["version"] == str(seed)
        assert client.get("/v1/models/mnist/labels/stable").json() == {
            "model_version_status": [{"version": "2", "state": "AVAILABLE",
                                      "status": {"error_code": "OK", "error_message": ""}}]}
        for path, words in (("/v1/models/mnist/versions/1:predict", "no version '1' available"),
                            ("/v1/models/mnist/labels/beta:predict", "no version label 'beta'"),
                            ("/v1/models/mnist/versions/x:predict", "no version 'x'")):
            answer = client.post(path, json=body)
            assert answer.status_code == 404 and words in answer.json()["error"], answer.text


def test_config_file_serves_several_models(tmp_path, exports, expected, reaper):
    publish_version(exports[1], str(tmp_path / "a"), 1)
    publish_version(exports[2], str(tmp_path / "b"), 7)
    publish_version(exports[3], str(tmp_path / "b"), 8)
    config = tmp_path / "models.config"
    config.write_text("""model_config_list {
      config { name: "a" base_path: "a" }
      config { name: "b" base_path: "b" model_version_policy { all {} }
               version_labels { key: "old" value: 7 } }
    }""")
    proc, url = start_server(reaper.popen, str(config), flag="--model-config-file")
    body = {"instances": [{"image": IMAGES[2].tolist(), "key": 2}]}
    with httpx.Client(base_url=url, timeout=60) as client:
        for path, seed in (("/v1/models/a", 1), ("/v1/models/b", 3),
                           ("/v1/models/b/labels/old", 2)):
            answer = client.post(f"{path}:predict", json=body)
            assert answer.status_code == 200, answer.text
            assert which(expected, 2, answer.json()["predictions"][0]["scores"]) == seed
        assert "not found; this server serves 'a', 'b'" in client.get(
            "/v1/models/c").json()["error"]


def test_gs_base_path_is_watched(gcs_emulator, exports, expected, reaper):
    base = "gs://mljob-test/served/mnist"
    publish_version(exports[1], base, 1)
    proc, url = start_server(reaper.popen, base, "--file-system-poll-wait-seconds", "0.3",
                             flag="--model-base-path")
    body = {"instances": [{"image": IMAGES[3].tolist(), "key": 3}]}
    with httpx.Client(base_url=url, timeout=60) as client:
        publish_version(exports[2], base, 2)
        status = wait_for_status(client, MODEL,
                                 lambda s: states(s).get(2) == "AVAILABLE")
        assert states(status) == {2: "AVAILABLE", 1: "END"}
        answer = client.post(f"{MODEL}:predict", json=body)
        assert which(expected, 3, answer.json()["predictions"][0]["scores"]) == 2


@pytest.mark.slow  # long: CI runs it in the slow step
def test_three_swaps_under_100_concurrent_clients(tmp_path, exports, expected, reaper):
    """100 real clients (80 HTTP, 20 gRPC with TF Serving's stubs) predict without
    pause while versions 2, 3 and 4 are published one after another: no request fails,
    every answer is one of the published versions' exact outputs (and a gRPC answer's
    model_spec names that version), and the status shows each switch."""
    import grpc
    from predict.serving_api.apis import predict_pb2, prediction_service_pb2_grpc
    from mljob.procs import free_ports
    base = tmp_path / "base"
    publish_version(exports[1], str(base), 1)
    grpc_port = free_ports(1)[0]
    proc, url = start_server(reaper.popen, str(base), "--file-system-poll-wait-seconds",
                             "0.2", "--threads", "8", "--grpc-port", str(grpc_port),
                             flag="--model-base-path")
    seen, failures, switches = [], [], []
    switched_at: dict[int, float] = {}  # when the status first showed the version alone
    stop = threading.Event()

    def publisher():
        with httpx.Client(base_url=url, timeout=60) as client:
            try:
                for version in (2, 3, 4):
                    time.sleep(1.0)
                    publish_version(exports[version], str(base), version)
                    status = wait_for_status(
                        client, MODEL, lambda s, v=version: states(s).get(v) == "AVAILABLE"
                        and states(s).get(v - 1) == "END")
                    switches.append(states(status))
                    switched_at[version] = time.time()
                time.sleep(1.0)
            finally:
                stop.set()

    async def client_loop(client, i):
        deadline = time.time() + 240  # bounded even if the publisher stalls
        index = i % len(IMAGES)
        body = {"instances": [{"image": IMAGES[index].tolist(), "key": i}]}
        while not stop.is_set() and time.time() < deadline:
            started = time.time()
            try:
                answer = await client.post(f"{MODEL}:predict", json=body)
            except httpx.HTTPError as exc:
                failures.append(repr(exc))
                continue
            if answer.status_code != 200:
                failures.append(answer.text)
                continue
            (prediction,) = answer.json()["predictions"]
            seen.append((started, which(expected, index, prediction["scores"])))

    async def grpc_loop(stub, i):
        deadline = time.time() + 240
        index = i % len(IMAGES)
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "default"
        request.inputs["image"].CopyFrom(tf.make_tensor_proto(IMAGES[index:index + 1]))
        request.inputs["key"].CopyFrom(tf.make_tensor_proto(np.array([i], np.int64)))
        while not stop.is_set() and time.time() < deadline:
            started = time.time()
            try:
                answer = await stub.Predict(request, timeout=120)
            except grpc.RpcError as exc:
                failures.append(f"gRPC {exc.code()}: {exc.details()}")
                continue
            version = which(expected, index, tf.make_ndarray(answer.outputs["scores"])[0])
            if version != answer.model_spec.version.value:
                failures.append(f"gRPC answer of version {version} labelled "
                                f"{answer.model_spec.version.value}")
            seen.append((started, version))

    async def main():
        limits = httpx.Limits(max_connections=80)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client, \
                grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            await asyncio.gather(*(client_loop(client, i) for i in range(80)),
                                 *(grpc_loop(stub, i) for i in range(20)))

    thread = threading.Thread(target=publisher)
    thread.start()
    try:
        asyncio.run(main())
    finally:
        stop.set()
        thread.join()
    assert failures == []
    assert switches == [{2: "AVAILABLE", 1: "END"}, {3: "AVAILABLE", 2: "END", 1: "END"},
                        {4: "AVAILABLE", 3: "END", 2: "END", 1: "END"}]
    versions = [v for _, v in seen]
    assert None not in versions                    # every answer is a published version's
    assert set(versions) >= {1, 4} and len(seen) >= 100
    # a request sent once the status showed version 4 alone is answered by version 4
    # (one sent before may still finish on version 3, which ends after its last request)
    after = [v for started, v in seen if started > switched_at[4]]
    assert after and set(after) == {4}


@pytest.mark.slow
def test_rss_stays_bounded_over_20_swaps(tmp_path, exports, reaper):
    base = tmp_path / "base"
    publish_version(exports[1], str(base), 1)
    proc, url = start_server(reaper.popen, str(base), "--file-system-poll-wait-seconds",
                             "0.1", flag="--model-base-path")
    rss = []
    body = {"instances": [{"image": IMAGES[0].tolist(), "key": 0}]}
    with httpx.Client(base_url=url, timeout=60) as client:
        for version in range(2, 22):
            publish_version(exports[1 + version % 2], str(base), version)
            wait_for_status(client, MODEL,
                            lambda s, v=version: states(s).get(v) == "AVAILABLE"
                            and states(s).get(v - 1) == "END")
            assert client.post(f"{MODEL}:predict", json=body).status_code == 200
            shutil.rmtree(base / str(version - 1))
            rss.append(psutil.Process(proc.pid).memory_info().rss)
    print("RSS MiB after each swap:", [round(r / 2**20) for r in rss])
    # after warm-up the last ten swaps may not keep growing the process
    assert rss[-1] - rss[9] < 100 * 2**20, [round(r / 2**20) for r in rss]


def test_usage_errors_exit_2_with_one_line(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "predict", "serve", *args],
                              capture_output=True, text=True, timeout=120)
    missing = run("--model-base-path", str(tmp_path / "nope"), "--port", "0")
    assert missing.returncode == 2 and "base path" in missing.stderr
    assert "does not exist" in missing.stderr
    policy = run("--model-base-path", str(tmp_path), "--model-version-policy", "newest")
    assert policy.returncode == 2 and "version policy 'newest' is not one of" in policy.stderr
    label = run("--model-base-path", str(tmp_path), "--version-label", "stable")
    assert label.returncode == 2 and "must be LABEL=VERSION" in label.stderr
    both = run("--model-base-path", str(tmp_path), "--model-dir", str(tmp_path))
    assert both.returncode == 2 and "give one of --model_dir, --model_base_path" in both.stderr
    for done in (missing, policy, label):
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_publish_adds_the_next_version_and_never_overwrites(tmp_path, exports, memfs, capsys):
    from predict.__main__ import main
    base = "memory://served/m"
    assert main(["publish", "--model-dir", exports[1], "--model-base-path", base]) == 0
    assert capsys.readouterr().out == f"published {exports[1]} as version 1 at {base}/1\n"
    assert main(["publish", "--model-dir", exports[2], "--model-base-path", base]) == 0
    assert main(["publish", "--model-dir", f"{base}/1", "--model-base-path", base,
                 "--version", "9"]) == 0
    assert sorted(scan_versions(base)) == [1, 2, 9]
    assert main(["publish", "--model-dir", exports[3], "--model-base-path", base,
                 "--version", "2"]) == 2
    assert "already has version 2" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["publish", "--model-dir", str(tmp_path / "empty"),
                 "--model-base-path", base]) == 2
    assert "holds no export" in capsys.readouterr().err
    assert sorted(scan_versions(base)) == [1, 2, 9]
