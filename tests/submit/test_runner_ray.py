"""`--runner ray`, the parts that need no cluster: the job we render (bundles from the
machine catalogue, the strategy, the pip list from the staged archives), the driver's
placement fit and log lines, and the refusals (each one line, nothing written). The
runs on a real Ray cluster are tests/e2e/test_ray_e2e.py and test_ray_netns.py."""
from __future__ import annotations

import json
import socket

import pytest

from tests.support.specs import resolve as spec_of
from submit import logs as logfmt
from submit.errors import SubmitError
from submit.packaging.package import Package
from submit.runners.engine import EngineOptions
from tests.support.submit_cli import nothing_written, one_error_line, run
from tests.support.ray_cluster import skip_reason

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")
ray_runner = pytest.importorskip("submit.runners.ray")
from submit.runners import ray_driver  # noqa: E402

GIB = 1024 ** 3
SHA = "a" * 64
PACKAGE = Package(file_name="mljob-0.1.0.tar.gz", sha256=SHA, top_dir="mljob-0.1.0",
                  url=f"gs://mljob-staging/job01/{SHA}/mljob-0.1.0.tar.gz")
ADDRESS = "http://10.0.0.5:8265"


def render(training_input, scale_tier=None, **options):
    spec = spec_of("job01", training_input, scale_tier=scale_tier,
                         job_dir="gs://mljob-test/jobs/job01", args=["--model", "mlp"])
    engine = ray_runner.RayEngine(EngineOptions(ray_address=ADDRESS, **options))
    engine.check(spec)
    return engine.render(spec, PACKAGE)


def test_standard_1_bundles_come_from_the_machine_catalogue():
    rendered = render({}, scale_tier="STANDARD_1")
    job = rendered.body["job"]
    labels = [r["label"] for r in job["replicas"]]
    assert labels == ["master-replica-0"] + [f"worker-replica-{i}" for i in range(4)] + \
        [f"ps-replica-{i}" for i in range(3)]
    # STANDARD_1's machines are `standard`: n1-standard-4, 4 vCPUs and 15 GiB
    assert {json.dumps(r["bundle"]) for r in job["replicas"]} == {
        json.dumps({"CPU": 4.0, "memory": float(15 * GIB)})}
    assert job["spread"] is True       # a ps job: STRICT_SPREAD where the nodes exist
    assert job["args"][-2:] == ["--job-dir", "gs://mljob-test/jobs/job01"]
    assert rendered.body["address"] == ADDRESS
    assert json.loads(rendered.text)["entrypoint"] == "python ray_driver.py job.json"


def test_custom_gpus_restarts_chief_name_and_the_pip_list():
    rendered = render({"scaleTier": "CUSTOM", "masterType": "standard_gpu",
                       "workerType": "n1-highmem-2", "workerCount": 2,
                       "workerConfig": {"restartPolicy": "ExitCode", "maxRestarts": 3},
                       "useChiefInTfConfig": True})
    job = rendered.body["job"]
    chief, worker = job["replicas"][0], job["replicas"][1]
    assert chief["task_type"] == "chief" and chief["is_chief"]
    assert chief["bundle"] == {"CPU": 8.0, "memory": float(30 * GIB), "GPU": 1.0}
    assert worker["bundle"] == {"CPU": 2.0, "memory": float(int(13 * GIB))}
    assert (worker["restart_policy"], worker["max_restarts"]) == ("ExitCode", 3)
    assert job["spread"] is False      # all-reduce peers: PACK
    # each archive from the working dir, in a folder named by its hash
    assert rendered.body["runtime_env"]["pip"]["packages"] == [
        f"${{RAY_RUNTIME_ENV_CREATE_WORKING_DIR}}/packages/{SHA}/mljob-0.1.0.tar.gz"]
    assert job["env"]["PYTHONPATH"] == ""   # no working tree shadows the install


def test_fit_caps_cpus_at_the_largest_node_and_spreads_a_ps_job():
    nodes = [{"CPU": 2.0, "memory": 8.0 * GIB}] * 3
    bundles, strategy = ray_driver.fit([{"CPU": 4.0, "memory": 15.0 * GIB}] * 3, nodes,
                                       spread=True)
    assert strategy == "STRICT_SPREAD"
    assert bundles == [{"CPU": 2.0, "memory": 8.0 * GIB}] * 3
    # one node: the ps job still runs, packed
    assert ray_driver.fit([{"CPU": 1.0}] * 3, [{"CPU": 3.0}], spread=True)[1] == "PACK"
    assert ray_driver.fit([{"CPU": 1.0}] * 2, [{"CPU": 2.0}] * 2, spread=False)[1] == "PACK"


def test_fit_refuses_in_one_line_what_the_cluster_never_holds():
    with pytest.raises(ValueError) as caught:
        ray_driver.fit([{"CPU": 1.0}] * 3, [{"CPU": 2.0}], spread=False)
    assert "cannot place the job's 3 replicas" in str(caught.value)
    assert "\n" not in str(caught.value)
    with pytest.raises(ValueError, match="GPU"):  # GPUs are never scaled down
        ray_driver.fit([{"CPU": 1.0, "GPU": 1.0}], [{"CPU": 8.0}], spread=False)


def test_driver_lines_are_the_local_runners_format_and_parse_back():
    line = ray_driver.log_line("service", "replica ps-replica-0 state=RUNNING restarts=2 "
                               "exit=- node=10.0.0.2")
    ours = logfmt.format_line("service", "x")
    assert line.split("\t")[0] == ours.split("\t")[0] and \
        len(line.split("\t")[1]) == len(ours.split("\t")[1])
    assert ray_runner.parse_event(line) == ("ps-replica-0", {
        "state": "RUNNING", "restarts": "2", "exit": "-", "node": "10.0.0.2"})
    done = ray_driver.log_line("service", "job FAILED: The replica x exited")
    assert ray_runner.parse_result(done) == ("FAILED", "The replica x exited")
    states, result = ray_runner._replicas("\n".join([line, done, "INFO\tt\tps\tnoise"]))
    assert states[0].label == "ps-replica-0" and states[0].restarts == 2
    assert result == ("FAILED", "The replica x exited")


@pytest.mark.parametrize("policy,status,again", [
    ("Never", 137, False), ("ExitCode", 137, True), ("ExitCode", 1, False),
    ("OnFailure", 1, True), ("Always", 0, False)])
def test_restart_rule_is_the_local_runners(policy, status, again):
    from submit.local.supervisor import should_restart
    assert ray_driver.should_restart(policy, status) is again
    assert should_restart(policy, status) is again


@pytest.mark.parametrize("address,fragment", [
    ("ray://10.0.0.5:10001", "not a Ray dashboard address"),
    ("http://10.0.0.5:8265/api", "not a Ray dashboard address"),
    ("10.0.0.5", "not a Ray dashboard address"),
    ("http://10.0.0.5:8265\n", "control"),
])
def test_bad_addresses_are_one_line(capsys, tmp_path, pkg, address, fragment):
    status, _, err = run(capsys, "job01", "--runner", "ray", "--ray-address", address,
                         "--package-path", pkg, "--job-dir", str(tmp_path / "out"))
    assert status != 0
    assert fragment in one_error_line(err)
    nothing_written(tmp_path / "out")


def test_no_address_names_the_flag_and_the_variable(capsys, tmp_path, pkg, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    status, _, err = run(capsys, "job01", "--runner", "ray", "--package-path", pkg,
                         "--job-dir", str(tmp_path / "out"))
    assert status != 0
    line = one_error_line(err)
    assert "--ray-address" in line and "RAY_ADDRESS" in line


def test_an_address_nobody_listens_on_is_refused_before_staging(capsys, tmp_path, pkg):
    with socket.socket() as s:  # a port that was free a moment ago: refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    status, _, err = run(capsys, "job01", "--runner", "ray", "--ray-address",
                         f"http://127.0.0.1:{port}", "--package-path", pkg,
                         "--job-dir", str(tmp_path / "out"))
    assert status != 0
    assert "cannot reach the Ray cluster's dashboard" in one_error_line(err)
    nothing_written(tmp_path / "out")


def test_an_address_that_is_not_a_dashboard_is_one_line(monkeypatch):
    monkeypatch.setattr(ray_runner, "CONNECT_TIMEOUT_S", 0.5)
    with socket.socket() as server:  # something listens, and answers nothing useful
        server.bind(("127.0.0.1", 0))
        server.listen()
        with pytest.raises(SubmitError, match="does not answer as a Ray dashboard"):
            ray_runner._client(f"http://127.0.0.1:{server.getsockname()[1]}")


def test_a_replica_back_on_its_machine_takes_its_old_port(monkeypatch):
    """The lost replica's connections linger in TIME_WAIT on its old port where its
    machine came back: the new actor still offers that port (the trainer's gRPC server
    binds it), while a port something listens on is never offered."""
    import ray
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "127.0.0.1")
    monkeypatch.setattr(ray, "get_runtime_context",
                        lambda: type("Context", (), {"get_node_id": lambda self: "n1"})())
    listener = socket.socket()   # the lost trainer's server: gRPC sets SO_REUSEADDR
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    accepted.close()          # this side closes first: its end waits in TIME_WAIT
    client.close()
    listener.close()
    with socket.socket() as plain:   # the lingering connection holds the port
        with pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))
    actor = ray_driver.ReplicaActor("worker-replica-0")
    assert actor.where(port) == ("n1", "127.0.0.1", port)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        node, ip, offered = actor.where(taken)
        assert offered not in (taken, 0)


def test_a_cluster_that_asks_for_its_token_is_one_line_naming_it():
    """A Ray dashboard with token authentication on answers 401 without the token
    (Ray's own answer text); the runner says what to set, not that it is no dashboard."""
    import http.server
    import threading

    class Dashboard(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"Unauthorized: Missing authentication token"
            self.send_response(401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Dashboard)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(SubmitError) as caught:
            ray_runner._client(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    message = str(caught.value)
    assert "asks for its authentication token (401" in message
    assert "RAY_AUTH_MODE=token" in message and "\n" not in message


@pytest.mark.parametrize("extra,fragment", [
    (["--package-path", "PKG", "--job-dir", "memory://out"], "memory://"),
    (["--master-image-uri", "img:1", "--job-dir", "gs://bkt/o"], "custom containers"),
])
def test_what_ray_cannot_run_is_refused(capsys, pkg, extra, fragment):
    extra = [pkg if arg == "PKG" else arg for arg in extra]
    status, _, err = run(capsys, "job01", "--runner", "ray", "--ray-address", ADDRESS,
                         *extra)
    assert status != 0 and fragment in one_error_line(err)


def test_a_tuning_job_is_the_tuning_runners():
    """A job with hyperparameters is run by the study of Ray trials (ray_tuning)."""
    hp = {"hyperparameters": {
        "goal": "MAXIMIZE", "hyperparameterMetricTag": "accuracy", "maxTrials": 2,
        "params": [{"parameterName": "lr", "type": "DOUBLE", "minValue": 0.01,
                    "maxValue": 0.1}]}}
    from submit import jobs, runners, submission
    assert runners.get("ray") is ray_runner.RayEngine
    tuning = runners.get("ray", tuning=True)
    assert tuning.__name__ == "RayTuningEngine" and tuning.name == "ray"
    assert runners.get("local", tuning=True) is runners.get("local")
    record = jobs.JobRecord("job01", runner="ray", training_input=hp)
    assert type(submission.runner_for(record)) is tuning  # describe, cancel, logs
    record.training_input = {}
    assert type(submission.runner_for(record)) is ray_runner.RayEngine


def test_ray_address_belongs_to_the_ray_runner(capsys, pkg, tmp_path):
    status, _, err = run(capsys, "job01", "--ray-address", ADDRESS, "--package-path", pkg,
                         "--job-dir", str(tmp_path / "out"))
    assert status != 0
    assert "--ray-address is for --runner ray" in one_error_line(err)
