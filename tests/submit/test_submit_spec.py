"""submit's validation (every user mistake: one line, exit 2, nothing staged) and the
--dry-run plan checked field by field against Cloud ML's contracts."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from submit.jobdef import spec as specs

from tests.support.common import ROOT
from tests.support.submit_cli import dry_run, files_under, run, write_package  # noqa: F401


# --- validation errors -------------------------------------------------------------

def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


CASES = [
    # (argv after the job id, expected fragment of the message)
    (["--scale-tier", "CUSTOM"],
     "scale tier CUSTOM needs the master's machine type; pass --master-machine-type"),
    (["--worker-count", "2"], "--worker-count needs --scale-tier CUSTOM"),
    (["--scale-tier", "STANDARD_1", "--parameter-server-count", "1"],
     "--parameter-server-count needs --scale-tier CUSTOM"),
    (["--config", "{custom}", "--worker-count", "-1"], "--worker-count -1 is negative"),
    (["--config", "{custom}", "--worker-count", "65"],
     "more than the local runner's limit of 64"),
    (["--config", "{custom}", "--worker-count", "0", "--parameter-server-count", "1"],
     "parameterServerCount needs workerCount of 1 or more"),
    (["--config", "{unknown_key}"], "trainingInput has unknown key 'workerCounts'; allowed "
                                    "keys are scaleTier"),
    (["--config", "{unknown_top}"], "has unknown key 'trainingInputs'"),
    (["--config", "{wrong_type}"], "trainingInput.workerCount must be an integer, not a "
                                   "string"),
    (["--config", "{bool_count}"], "trainingInput.evaluatorCount must be an integer, not "
                                   "true or false"),
    (["--config", "{list_doc}"], "must be a mapping with a 'trainingInput' key, not list"),
    (["--config", "{alias_bomb}"], "its YAML aliases expand to more than 10000 values"),
    (["--config", "{bad_yaml}"], "is not valid YAML"),
    (["--config", "{huge}"], "the limit is 1048576"),
    (["--config", "{bad_machine}"], "unknown masterType 'gigantic'"),
    (["--config", "{tuning}"],
     "trainingInput.hyperparameters.params must be a non-empty list"),
    (["--config", "{accel_key}"], "acceleratorConfig has unknown key 'cores'"),
    (["--config", "{accel}"], "needs 1 GPU(s) per replica and this machine has 0"),
    (["--scale-tier", "BASIC_GPU"], "needs 1 GPU(s) per replica and this machine has 0"),
    (["--job-dir", "s3://bucket/x"], "unknown URL scheme 's3'"),
    (["--staging-bucket", "http://127.0.0.1/x"], "unknown URL scheme 'http'"),
    (["--module-name", "trainer/task.py"], "is not a Python module name"),
    (["--", "--job-dir", "/elsewhere"], "--job-dir is among the trainer arguments"),
    (["--scale-tier", "HUGE"], "unknown scale tier 'HUGE'; use one of basic, standard-1"),
    (["--scale-tier", "basic-tpu"], "Cloud TPUs are not available to mljob's runners"),
    (["--no-such-flag"], "No such option '--no-such-flag'"),
    (["stray"], "unexpected extra argument"),
]


@pytest.mark.parametrize("extra,message", CASES)
def test_usage_errors_exit_2_and_stage_nothing(capsys, tmp_path, pkg, extra, message):
    if "GPU" in message and specs.local_gpu_count():
        pytest.skip("this machine has a GPU")
    configs = {
        "custom": "trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n",
        "unknown_key": "trainingInput:\n  scaleTier: CUSTOM\n  workerCounts: 2\n",
        "unknown_top": "trainingInputs:\n  scaleTier: BASIC\n",
        "wrong_type": "trainingInput:\n  workerCount: 'two'\n",
        "bool_count": '{"trainingInput": {"evaluatorCount": true}}',
        "list_doc": "- trainingInput\n",
        "alias_bomb": "x-a: &a [x, x, x, x, x, x, x, x, x]\nx-b: &b [*a, *a, *a, *a, *a, *a]\n"
                      "x-c: &c [*b, *b, *b, *b, *b, *b]\nx-d: &d [*c, *c, *c, *c, *c, *c]\n"
                      "x-e: &e [*d, *d, *d, *d, *d, *d]\ntrainingInput: {args: *e}\n",
        "bad_yaml": "trainingInput: [unclosed\n",
        "huge": "# " + "x" * (1024 * 1024) + "\ntrainingInput: {}\n",
        "bad_machine": "trainingInput:\n  scaleTier: CUSTOM\n  masterType: gigantic\n",
        "tuning": "trainingInput:\n  hyperparameters: {goal: MAXIMIZE, maxTrials: 4}\n",
        "accel_key": "trainingInput:\n  masterConfig: {acceleratorConfig: {cores: 2}}\n",
        "accel": "trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
                 "  masterConfig:\n    acceleratorConfig: {count: 1, type: NVIDIA_TESLA_T4}\n",
    }
    names = {"bool_count": "config.json"}
    argv = []
    for arg in extra:
        if arg.startswith("{") and arg.endswith("}"):
            key = arg[1:-1]
            arg = write(tmp_path, names.get(key, f"{key}.yaml"), configs[key])
        argv.append(arg)
    job_dir, staging = tmp_path / "job", tmp_path / "staging"
    status, out, err = run(capsys, "job01", "--job-dir", str(job_dir), "--staging-bucket",
                           str(staging), "--package-path", pkg, *argv)
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert message in lines[0]
    assert files_under(job_dir, staging) == []
    assert not os.path.exists(os.environ["MLJOB_HOME"] + "/jobs")


def test_job_id_rules(capsys, tmp_path, pkg):
    for bad in ("1job", "job-01", "job 01", "j" * 129, "_job"):
        status, _, err = run(capsys, "submit", bad, "--job-dir", str(tmp_path / "job"),
                             "--package-path", pkg)
        assert status == 2 and "invalid job id" in err and err.count("\n") == 1
    assert files_under(tmp_path / "job") == []
    specs.check_job_id("j" * 128)


def test_staging_location_is_required(capsys, pkg):
    status, _, err = run(capsys, "job01", "--package-path", pkg)
    assert status == 2
    assert err.strip() == ("error: If local packages are provided, the --staging-bucket "
                           "or --job-dir flag must be given.")


def test_a_package_folder_without_python_files_is_a_clear_error(capsys, tmp_path):
    (tmp_path / "src").mkdir()
    status, _, err = run(capsys, "job01", "--job-dir", str(tmp_path / "job"),
                         "--package-path", str(tmp_path / "src"))
    assert status == 2 and "holds no .py file" in err
    assert files_under(tmp_path / "job") == []


def test_a_package_folder_whose_name_is_no_python_name_is_a_clear_error(capsys, tmp_path):
    (tmp_path / "my-trainer").mkdir()
    (tmp_path / "my-trainer" / "task.py").write_text("print(1)\n")
    status, _, err = run(capsys, "job01", "--job-dir", str(tmp_path / "job"),
                         "--package-path", str(tmp_path / "my-trainer"))
    assert status == 2 and "'my-trainer' is not a Python package name" in err
    assert files_under(tmp_path / "job") == []


def test_job_id_used_in_job_dir_needs_resume(capsys, tmp_path, pkg):
    job_dir = tmp_path / "job"
    (job_dir / "jobs").mkdir(parents=True)
    (job_dir / "jobs" / "job01.json").write_text("{}")
    status, _, err = run(capsys, "job01", "--job-dir", str(job_dir), "--package-path", pkg)
    assert status == 2 and "already used in" in err and "--resume" in err
    assert files_under(job_dir) == [str(job_dir / "jobs" / "job01.json")]
    plan = dry_run(capsys, "job01", "--job-dir", str(job_dir), "--package-path", pkg,
                   "--resume")
    assert plan["job_id"] == "job01"


def test_async_refuses_memory_job_dir(capsys, pkg, memfs):
    status, _, err = run(capsys, "job01", "--job-dir", "memory://jobs/job01", "--async",
                         "--package-path", pkg)
    assert status == 2 and "--async cannot use a memory:// job dir" in err
    assert memfs.find("/") == []


# --- the plan ------------------------------------------------------------------------

def test_dry_run_standard_1_matches_cloud_ml(capsys, tmp_path, pkg):
    job_dir = str(tmp_path / "job")
    plan = dry_run(capsys, "job01", "--scale-tier", "STANDARD_1", "--job-dir", job_dir,
                   "--package-path", pkg, "--module-name", "fakejob.task", "--",
                   "--model", "mlp", "--train-steps", "20")
    assert files_under(tmp_path / "job") == []  # a dry run stages nothing
    cluster = plan["cluster"]
    assert sorted(cluster) == ["chief", "ps", "worker"]
    assert (len(cluster["chief"]), len(cluster["worker"]), len(cluster["ps"])) == (1, 4, 3)
    addresses = [a for hosts in cluster.values() for a in hosts]
    assert len(set(addresses)) == 8 and all(a.startswith("127.0.0.1:") for a in addresses)
    labels = [r["label"] for r in plan["replicas"]]
    assert sorted(labels) == sorted(["master-replica-0"] + [f"worker-replica-{i}" for i in
                                    range(4)] + [f"ps-replica-{i}" for i in range(3)])
    sha = plan["package_sha256"]
    assert len(sha) == 64
    assert plan["package_url"] == f"{job_dir}/packages/{sha}/fakejob-0.1.tar.gz"
    for replica in plan["replicas"]:
        tf_config = json.loads(replica["env"]["TF_CONFIG"])
        assert tf_config == replica["tf_config"]
        assert set(tf_config) == {"cluster", "task", "job", "environment"}
        assert tf_config["environment"] == "cloud"
        assert tf_config["cluster"] == cluster
        assert tf_config["job"]["scaleTier"] == "STANDARD_1"
        assert tf_config["job"]["args"] == ["--model", "mlp", "--train-steps", "20"]
        kind, _, index = replica["label"].split("-")
        task = tf_config["task"]
        assert task["type"] == {"master": "chief"}.get(kind, kind)
        assert task["index"] == int(index) and replica["index"] == int(index)
        assert replica["address"] == cluster[task["type"]][task["index"]]
        command = replica["command"]
        assert command[1:] == ["-m", "mljob.fitting.launch", "fakejob.task", "--model",
                               "mlp", "--train-steps", "20", "--job-dir", job_dir]
        env = replica["env"]
        assert env["PYTHONPATH"] == ""  # no working tree shadows the installed package
        assert command[0] == os.path.join(plan["env_root"], plan["env_key"], "bin", "python")
        assert env["GRPC_FAIL_FAST"] == "use_caller" and env["PYTHONUNBUFFERED"] == "1"
        assert replica["log_file"] == f"{job_dir}/logs/{replica['label']}.log"


def test_dry_run_basic_and_staging_bucket_layout(capsys, tmp_path, pkg, gcs_emulator):
    plan = dry_run(capsys, "job02", "--job-dir", "gs://mljob-test/jobs/job02",
                   "--staging-bucket", "gs://mljob-test/staging", "--package-path", pkg)
    assert plan["scale_tier"] == "BASIC"
    sha = plan["package_sha256"]
    assert plan["package_url"] == \
        f"gs://mljob-test/staging/job02/{sha}/fakejob-0.1.tar.gz"
    (replica,) = plan["replicas"]
    assert replica["label"] == "master-replica-0"
    assert replica["tf_config"]["task"] == {"type": "chief", "index": 0}
    assert list(replica["tf_config"]["cluster"]) == ["chief"]
    assert replica["command"][-2:] == ["--job-dir", "gs://mljob-test/jobs/job02"]
    assert plan["mirrors"] == [[plan["log_dir"], "gs://mljob-test/jobs/job02/logs"]]


def test_dry_run_custom_config_with_evaluator_and_master_naming(capsys, tmp_path, pkg):
    config = write(tmp_path, "config.yaml", """
trainingInput:
  scaleTier: CUSTOM
  masterType: complex_model_m
  workerType: standard
  parameterServerType: large_model
  workerCount: 2
  parameterServerCount: 1
  evaluatorCount: 1
  useChiefInTfConfig: false
  region: us-central1
  args: ["--train-steps", "100"]
  jobDir: JOBDIR
""".replace("JOBDIR", str(tmp_path / "from-config")))
    plan = dry_run(capsys, "job03", "--config", config, "--package-path", pkg,
                   "--worker-count", "3", "--", "--train-steps", "7")
    assert plan["job_dir"] == str(tmp_path / "from-config")
    cluster = plan["cluster"]
    assert sorted(cluster) == ["master", "ps", "worker"]  # useChiefInTfConfig: false
    assert len(cluster["worker"]) == 3  # the flag overrides the file
    by_label = {r["label"]: r for r in plan["replicas"]}
    evaluator = by_label["evaluator-replica-0"]
    assert evaluator["tf_config"]["task"] == {"type": "evaluator", "index": 0}
    assert "evaluator" not in evaluator["tf_config"]["cluster"]
    assert evaluator["address"] is None
    assert by_label["master-replica-0"]["tf_config"]["task"]["type"] == "master"
    job = evaluator["tf_config"]["job"]
    assert job["workerCount"] == 3 and job["region"] == "us-central1"
    assert job["args"] == ["--train-steps", "7"]  # args after -- replace the file's
    assert evaluator["command"][4:] == ["--train-steps", "7", "--job-dir",
                                        str(tmp_path / "from-config")]


def test_repository_config_yaml_is_a_valid_custom_job(capsys, tmp_path):
    plan = dry_run(capsys, "example", "--config", os.path.join(ROOT, "config.yaml"),
                   "--job-dir", str(tmp_path / "job"))
    assert plan["scale_tier"] == "CUSTOM"
    assert len(plan["cluster"]["worker"]) == 2 and len(plan["cluster"]["ps"]) == 1
    assert "--model" in plan["trainer_args"]
    assert plan["package_top_dir"] == "mljob-0.1.0"


def test_package_hash_is_stable_and_follows_content(capsys, tmp_path, pkg):
    first = dry_run(capsys, "job01", "--job-dir", str(tmp_path / "job"), "--package-path",
                    pkg)["package_sha256"]
    again = dry_run(capsys, "job01", "--job-dir", str(tmp_path / "job"), "--package-path",
                    pkg)["package_sha256"]
    assert first == again
    with open(os.path.join(pkg, "fakejob", "task.py"), "a") as f:
        f.write("# changed\n")
    changed = dry_run(capsys, "job01", "--job-dir", str(tmp_path / "job"), "--package-path",
                      pkg)["package_sha256"]
    assert changed != first
    shutil.rmtree(os.path.join(pkg, "fakejob", "__pycache__"), ignore_errors=True)


def test_help_explains_submit_jobs_and_local(capsys):
    status, out, _ = run(capsys, "--help")
    assert status == 0
    for text in ("python -m submit JOB_ID", "jobs list", "local train"):
        assert text in out


def test_package_uris_run_an_already_staged_package(capsys, tmp_path, pkg):
    from submit.packaging import package
    built = package.build(pkg, str(tmp_path / "dist"))
    config = write(tmp_path, "config.yaml", "trainingInput:\n  packageUris: [%s]\n"
                   % json.dumps(built.local_file))
    plan = dry_run(capsys, "job04", "--config", config, "--job-dir", str(tmp_path / "job"))
    assert plan["package_url"] == built.local_file
    assert plan["package_sha256"] == built.sha256
    status, _, err = run(capsys, "job04", "--config", config, "--package-path", pkg,
                         "--job-dir", str(tmp_path / "job"))
    assert status == 2 and "or --package-path, not both" in err


def test_replica_limit_is_the_runners(capsys, tmp_path, pkg):
    """100 workers: the engines render them, the local runner refuses in one line that
    names its limit and the engines."""
    config = write(tmp_path, "config.yaml", "trainingInput:\n  scaleTier: CUSTOM\n"
                   "  masterType: standard\n  workerCount: 100\n"
                   "  parameterServerCount: 2\n")
    common = ("job100", "--config", config, "--package-path", pkg,
              "--job-dir", "gs://mljob-test/jobs/job100", "--dry-run")
    status, out, _ = run(capsys, *common, "--runner", "kubeflow")
    assert status == 0 and "replicas: 100" in out.replace("Replicas", "replicas")
    status, out, _ = run(capsys, *common, "--runner", "vertex", "--project",
                         "my-project-123")
    body = json.loads(out)
    assert status == 0 and body["customJob"]["jobSpec"]["workerPoolSpecs"][1][
        "replicaCount"] == "100"
    status, out, err = run(capsys, *common)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and "100 worker replicas are more than the local " \
        "runner's limit of 64 per type" in err and "--runner kubeflow or vertex" in err
