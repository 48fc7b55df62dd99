"""Custom containers on the local runner, the parts that need no container started: the
plan a dry run prints (each replica the engine's `run` of its image, on the job's
network, TF_CONFIG naming the replicas' host names), the GPU flags acceleratorConfig
gives, and the one-line refusals an engine that is missing or has no daemon gets. The
containers themselves run in tests/e2e/test_containers.py (slow)."""
from __future__ import annotations

import json
import shutil

import pytest

from submit.local import container_engine as ce
from tests.support.submit_cli import dry_run, one_error_line, run, write_package

CONFIG = ("trainingInput:\n  scaleTier: CUSTOM\n  masterType: n1-standard-4\n"
          "  workerType: n1-standard-4\n  parameterServerType: n1-standard-4\n"
          "  workerCount: 2\n  parameterServerCount: 1\n"
          "  masterConfig:\n    imageUri: localhost/trainer:1\n"
          "    containerCommand: [python, -m, trainer.task]\n"
          "  parameterServerConfig:\n    imageUri: localhost/ps:2\n"
          "    containerArgs: [--role, ps]\n")
PODMAN = ce.Engine("podman", "/usr/bin/podman")
DOCKER = ce.Engine("docker", "/usr/bin/docker")


def _plan(capsys, tmp_path, monkeypatch, engine="podman"):
    monkeypatch.setenv(ce.ENGINE_ENV, engine)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    return dry_run(capsys, "job01", "--config", str(config), "--job-dir",
                   str(tmp_path / "jd"), "--", "--train-steps", "5")


def _option(argv, flag):
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_each_replica_runs_its_image_on_the_jobs_network(capsys, tmp_path, monkeypatch):
    plan = _plan(capsys, tmp_path, monkeypatch)
    reps = {r["label"]: r for r in plan["replicas"]}
    assert sorted(reps) == ["master-replica-0", "ps-replica-0", "worker-replica-0",
                            "worker-replica-1"]
    assert plan["containers"]["network"] == "mljob-job01" and plan["mode"] == "container"
    chief, worker, ps = (reps[k]["command"] for k in ("master-replica-0",
                                                      "worker-replica-1", "ps-replica-0"))
    assert chief[:2] == ["/usr/bin/podman", "run"] and "--init" in chief
    assert _option(chief, "--name") == ["mljob-job01-master-replica-0"]
    assert _option(chief, "--network") == ["mljob-job01"]
    assert _option(worker, "--hostname") == ["worker-replica-1"]
    # the image, then containerCommand's rest and the trainer args with the job dir
    image_at = chief.index("localhost/trainer:1")
    assert _option(chief, "--entrypoint") == ["python"]
    assert chief[image_at + 1:] == ["-m", "trainer.task", "--train-steps", "5",
                                    "--job-dir", str(tmp_path / "jd")]
    # a worker without its own image runs the master's, with the image's entrypoint
    assert "localhost/trainer:1" in worker and "--entrypoint" not in worker
    # containerArgs replace the trainer args
    assert ps[ps.index("localhost/ps:2") + 1:] == ["--role", "ps"]
    # the job dir is mounted at its own path; values pass by name, never the parent PID
    assert _option(chief, "--volume") == [f"{tmp_path / 'jd'}:{tmp_path / 'jd'}"]
    keys = _option(chief, "--env")
    assert "TF_CONFIG" in keys and "CLOUD_ML_JOB_ID" in keys
    assert "MLJOB_PARENT_PID" not in keys and all("=" not in k for k in keys)
    tf_config = json.loads(reps["worker-replica-1"]["env"]["TF_CONFIG"])
    assert tf_config["cluster"] == {
        "chief": ["master-replica-0:2222"],
        "worker": ["worker-replica-0:2222", "worker-replica-1:2222"],
        "ps": ["ps-replica-0:2222"]}
    assert tf_config["task"] == {"type": "worker", "index": 1}
    assert "PYTHONPATH" not in reps["master-replica-0"]["env"]


def test_docker_gets_the_same_run_without_podmans_replace(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(ce, "_docker_daemon", lambda engine: None)  # rendering only
    for engine, replace in (("docker", False), ("podman", True)):
        chief = next(r["command"] for r in _plan(capsys, tmp_path, monkeypatch, engine)[
            "replicas"] if r["label"] == "master-replica-0")
        assert chief[:2] == [f"/usr/bin/{engine}", "run"]
        assert ("--replace" in chief) == replace


@pytest.mark.parametrize("engine,gpus,devices,flags", [
    (PODMAN, 2, None, ["--device=nvidia.com/gpu=0", "--device=nvidia.com/gpu=1"]),
    (PODMAN, 1, "3", ["--device=nvidia.com/gpu=3"]),
    (DOCKER, 2, "1,2", ["--gpus", '"device=1,2"']),
    (DOCKER, 0, None, []),
])
def test_gpu_flags_from_the_accelerator_count(engine, gpus, devices, flags):
    assert ce.gpu_flags(engine, gpus, devices) == flags


def test_a_gpu_replica_gets_its_devices_in_the_run(capsys, tmp_path, monkeypatch):
    import submit.runners.local as local
    monkeypatch.setattr(local, "local_gpu_count", lambda: 2)
    monkeypatch.setenv(ce.ENGINE_ENV, "podman")
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    config = tmp_path / "config.yaml"
    config.write_text("trainingInput:\n  scaleTier: CUSTOM\n  masterType: n1-standard-8\n"
                      "  masterConfig:\n    imageUri: localhost/trainer:1\n"
                      "    acceleratorConfig: {count: 2, type: NVIDIA_TESLA_T4}\n")
    plan = dry_run(capsys, "job01", "--config", str(config), "--job-dir",
                   str(tmp_path / "jd"))
    chief = plan["replicas"][0]["command"]
    assert [a for a in chief if a.startswith("--device")] == [
        "--device=nvidia.com/gpu=0", "--device=nvidia.com/gpu=1"]


def test_engine_choice_one_liners(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(Exception, match="none is installed here; install podman"):
        ce.detect(environ={})
    with pytest.raises(Exception, match="is neither podman nor docker"):
        ce.detect("runc", environ={})
    with pytest.raises(Exception, match="docker is not installed here"):
        ce.detect("docker", environ={})


def test_a_docker_client_without_a_daemon_is_refused(capsys, tmp_path, monkeypatch):
    """This machine's docker is a client alone (no daemon): a job naming it is refused in
    one line, before anything is written."""
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client here")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    monkeypatch.setenv(ce.ENGINE_ENV, "docker")
    status, out, err = run(capsys, "job01", "--master-image-uri", "localhost/t:1",
                           "--job-dir", str(tmp_path / "jd"))
    assert status == 2 and out == ""
    assert "docker client whose daemon does not answer" in one_error_line(err)
    assert not (tmp_path / "jd").exists()


def test_an_image_that_is_not_there_is_refused(capsys, tmp_path, monkeypatch):
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed here")
    monkeypatch.setenv(ce.ENGINE_ENV, "podman")
    status, out, err = run(capsys, "job01", "--master-image-uri",
                           "localhost/mljob-no-such-image:1", "--job-dir",
                           str(tmp_path / "jd"))
    assert status == 2 and out == ""
    line = one_error_line(err)
    assert "localhost/mljob-no-such-image:1 is not in podman's local images" in line
    assert "--build-image" in line and not (tmp_path / "jd").exists()


@pytest.mark.parametrize("argv,words", [
    (["--base-image", "localhost/b:1"], "--base-image is the base of --build-image"),
    (["--build-image", "localhost/t:1", "--runner", "kubeflow"],
     "--build-image is for --runner local, not --runner kubeflow"),
    (["--build-image", "localhost/t:1", "--master-image-uri", "localhost/m:1"],
     "--build-image names every replica's image; drop --master-image-uri"),
    (["--build-image", "Local/T 1"], "--build-image 'Local/T 1' is not a container image"),
    (["--container-engine", "podman", "--runner", "kubeflow", "--job-dir", "gs://b/j",
      "--image", "r/i:1"], "--container-engine"),
])
def test_build_image_mistakes_are_one_line(capsys, tmp_path, argv, words):
    status, out, err = run(capsys, "job01", "--job-dir", str(tmp_path / "jd"), *argv)
    assert status == 2 and out == ""
    assert words in one_error_line(err)
    assert not (tmp_path / "jd").exists()


def test_build_image_keeps_the_module_for_the_record(capsys, tmp_path, monkeypatch):
    """`--build-image` with `--module-name`: the package path is spent on the image, the
    module stays the job's (`pythonModule` in its record, `jobs describe`)."""
    monkeypatch.setenv(ce.ENGINE_ENV, "podman")
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    pkg = write_package(tmp_path / "pkg")
    plan = dry_run(capsys, "job01", "--package-path", pkg, "--module-name", "fakejob.task",
                   "--build-image", "localhost/fakejob:1", "--job-dir", str(tmp_path / "jd"))
    assert plan["module"] == "fakejob.task"
    chief = plan["replicas"][0]["command"]
    assert "localhost/fakejob:1" in chief and "--entrypoint" not in chief


def test_a_packages_image_installs_mljobs_core_beside_it(tmp_path):
    """The Dockerfile a `--build-image` image is built from installs the user's sdist and
    mljob's core (an sdist of `mljob` alone), whether or not the package imports mljob:
    the replicas' command runs mljob's launcher."""
    from submit.packaging import package as packages
    from submit.runners import images
    from submit.runners.kubeflow_render import dockerfile
    pkg = packages.build(write_package(tmp_path / "pkg"), str(tmp_path / "out"))
    built = images.with_core(pkg, str(tmp_path / "out"))
    assert [p.dist_name for p in built.all] == ["fakejob", "mljob"]
    text = dockerfile(built, gpu=False)
    assert f"COPY {built.extras[0].file_name} " in text and "pip install" in text
    assert images.image_key(built) != pkg.sha256[:12]
    assert images.with_core(built, str(tmp_path / "out")) is built  # once


def test_the_builds_pip_gets_this_machines_pip_settings(tmp_path):
    from submit.local.image_build import pip_conf
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    text, paths = pip_conf({"index-url": "https://mirror.example/simple",
                            "extra-index-url": f"file://{wheels} file:///no/such/index",
                            "find-links": str(wheels), "no-index": "1",
                            "user": "ignored"})
    assert text.splitlines() == ["[global]", "index-url = https://mirror.example/simple",
                                 f"extra-index-url = file://{wheels}",
                                 f"find-links = {wheels}", "no-index = 1"]
    assert paths == [str(wheels)]


@pytest.mark.parametrize("argv,words", [
    (["--worker-pool-spec=replica-count=1"], "that is `custom-jobs create`'s"),
    (["--script", "task.py"], "give the module with --python-module"),
    (["--gpu"], "GPUs come from acceleratorConfig"),
    (["--extra-packages", "a.tar.gz"], "list them in --requirements"),
    (["--extra-dirs", "data"], "put the files in the package"),
    (["--service-account-key-file", "k.json"], "the container gets no credentials"),
    (["--executor-image-uri", "Bad Image"], "--executor-image-uri 'Bad Image' is not a "
                                            "container image"),
    (["--local-package-path", "/no/such/folder"], "is not a folder"),
])
def test_local_run_refuses_what_it_cannot_honour_in_one_line(capsys, tmp_path, argv, words):
    base = ["local-run", "--executor-image-uri", "localhost/base:1", "--python-module",
            "fakejob.task", "--local-package-path", write_package(tmp_path / "pkg")]
    status, out, err = run(capsys, *base, *argv)
    assert status == 2 and out == ""
    assert words in one_error_line(err)


@pytest.mark.parametrize("flag,instead", [
    ("--executor-image-uri", "--base-image IMAGE"), ("--python-module", "--module-name"),
    ("--local-package-path", "--package-path"), ("--output-image-uri", "--build-image"),
    ("--requirements", "install_requires"), ("--worker-pool-spec", "--config"),
])
def test_vertex_flags_given_to_a_submission_say_where_they_go(capsys, tmp_path, flag,
                                                              instead):
    status, out, err = run(capsys, "job01", flag, "x", "--job-dir", str(tmp_path / "jd"))
    assert status == 2 and out == ""
    line = one_error_line(err)
    assert f"{flag} is Vertex's" in line and "python -m submit local-run" in line
    assert instead in line and not (tmp_path / "jd").exists()


def test_local_run_refuses_an_executor_image_that_is_not_here(capsys, tmp_path):
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed here")
    status, out, err = run(capsys, "local-run", "--executor-image-uri",
                           "localhost/mljob-no-such-image:1", "--python-module",
                           "fakejob.task", "--local-package-path",
                           write_package(tmp_path / "pkg"), "--container-engine", "podman")
    assert status == 2 and out == ""
    assert "is not in podman's local images (nothing is pulled here)" in one_error_line(err)
