"""The whole job definition as gcloud and the engines take it: labels (config.yaml's and
--labels), scheduling deadlines, gcloud's per-type flags (CUSTOM from flags alone), the
default number of restarts, useChiefInTfConfig by runtimeVersion and bucket-name rules;
each as the spec resolves it and as the local plan, the TFJob and the CustomJob carry it."""
from __future__ import annotations

import json

import pytest
import yaml

from submit import jobs
from submit.jobdef import spec as specs
from submit.packaging.package import Package
from tests.support.submit_cli import dry_run, files_under, run

CUSTOM_FLAGS = ["--scale-tier", "CUSTOM", "--master-machine-type", "n1-standard-4",
                "--worker-count", "2", "--parameter-server-count", "1",
                "--labels", "team=vision"]


def resolve(ti=None, config_labels=None, **flags):
    return specs.resolve(specs.Flags("job01", job_dir="/tmp/mljob-jobdef", **flags),
                         specs.training_config(ti or {}, config_labels))


def write_config(tmp_path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


# --- labels -------------------------------------------------------------------------

def test_labels_flag_adds_to_and_overrides_the_config(tmp_path):
    config = write_config(tmp_path, "labels:\n  team: speech\n  env: dev\n")
    spec = resolve(config_labels=specs.load_labels(config),
                   labels=("team=vision,owner=ana", "cost-centre=ml_1"))
    assert spec.labels == {"team": "vision", "env": "dev", "owner": "ana",
                           "cost-centre": "ml_1"}
    assert resolve().labels == {}


def test_labels_reach_the_record_and_jobs_describe(capsys, tmp_path, pkg):
    config = write_config(tmp_path, "labels:\n  env: dev\n")
    status, out, err = run(capsys, "job01", "--job-dir", str(tmp_path / "job"),
                           "--package-path", pkg, "--module-name", "fakejob.task",
                           "--config", config, "--labels", "team=vision")
    assert status == 0, err
    status, out, err = run(capsys, "jobs", "describe", "job01")
    assert status == 0, err
    assert yaml.safe_load(out.split("\nView the logs")[0])["labels"] == {
        "env": "dev", "team": "vision"}
    with open(tmp_path / "job" / "jobs" / "job01.json") as f:
        assert json.load(f)["labels"] == {"env": "dev", "team": "vision"}


def test_custom_from_flags_alone_renders_for_every_runner(capsys, tmp_path, pkg):
    """gcloud's per-type flags give a whole CUSTOM cluster with no config file, and the
    labels are in each runner's object."""
    common = [*CUSTOM_FLAGS, "--package-path", pkg, "--module-name", "fakejob.task",
              "--worker-machine-type", "n1-highcpu-8",
              "--parameter-server-machine-type", "large_model"]
    plan = dry_run(capsys, "job01", "--job-dir", str(tmp_path / "job"), *common)
    assert plan["labels"] == {"team": "vision"}
    assert plan["cluster"].keys() == {"chief", "worker", "ps"}
    assert len(plan["cluster"]["worker"]) == 2 and len(plan["cluster"]["ps"]) == 1
    ti = plan["training_input"]
    assert (ti["masterType"], ti["workerType"], ti["parameterServerType"]) == \
        ("n1-standard-4", "n1-highcpu-8", "large_model")

    gs = ["--job-dir", "gs://mljob-test/jobdef/job01"]
    status, out, err = run(capsys, "job01", *gs, *common, "--runner", "kubeflow",
                           "--namespace", "ml", "--image", "img:1", "--dry-run")
    assert status == 0, err
    tfjob = yaml.safe_load(out)
    assert tfjob["metadata"]["labels"]["team"] == "vision"
    assert tfjob["metadata"]["labels"]["mljob/job-id"] == "job01"
    replicas = tfjob["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in replicas.items()} == {"Chief": 1, "Worker": 2,
                                                               "PS": 1}
    assert replicas["Worker"]["template"]["metadata"]["labels"]["team"] == "vision"
    assert replicas["Worker"]["template"]["spec"]["containers"][0]["resources"][
        "requests"]["cpu"] == "8"

    status, out, err = run(capsys, "job01", *gs, *common, "--runner", "vertex",
                           "--project", "my-project-123", "--dry-run")
    assert status == 0, err
    job = json.loads(out)["customJob"]
    assert job["labels"]["team"] == "vision" and job["labels"]["mljob-job-id"] == "job01"
    pools = job["jobSpec"]["workerPoolSpecs"]
    assert [p["machineSpec"]["machineType"] for p in pools] == \
        ["n1-standard-4", "n1-highcpu-8", "n1-highmem-8"]


# --- gcloud's per-type flags ----------------------------------------------------------

def test_accelerator_flags_become_accelerator_configs():
    spec = resolve(scale_tier="CUSTOM", master_machine_type="n1-standard-8",
                   master_accelerator="count=2,type=nvidia-tesla-t4", worker_count=1,
                   worker_machine_type="standard",
                   worker_accelerator="type=NVIDIA_TESLA_V100,count=1")
    ti = spec.training_input
    assert ti["masterConfig"]["acceleratorConfig"] == {"count": 2, "type": "NVIDIA_TESLA_T4"}
    assert ti["workerConfig"]["acceleratorConfig"] == {"count": 1,
                                                       "type": "NVIDIA_TESLA_V100"}
    assert (spec.group("chief").gpus, spec.group("worker").gpus) == (2, 1)


def test_flags_override_the_config_and_keep_its_replica_settings():
    ti = {"scaleTier": "CUSTOM", "masterType": "standard",
          "masterConfig": {"restartPolicy": "OnFailure", "maxRestarts": 2}}
    spec = resolve(ti, master_machine_type="n1-standard-16",
                   master_accelerator="count=1,type=nvidia-tesla-t4")
    chief = spec.group("chief")
    assert (chief.machine_type, chief.gpus, chief.restart_policy, chief.max_restarts) == \
        ("n1-standard-16", 1, "OnFailure", 2)


# --- restarts and the chief's name ----------------------------------------------------

def test_a_restart_policy_alone_allows_the_default_restarts():
    spec = resolve(restart_policy="OnFailure")
    assert spec.max_restarts == specs.DEFAULT_MAX_RESTARTS == 6
    assert all(g.max_restarts == 6 for g in spec.groups)
    assert resolve(restart_policy="OnFailure", max_restarts=0).group("chief").max_restarts == 0
    assert resolve().group("chief").max_restarts == 0
    config = {"masterConfig": {"restartPolicy": "ExitCode"}}
    assert resolve(config).group("chief").max_restarts == 6


@pytest.mark.parametrize("ti,use_chief", [
    ({}, True), ({"runtimeVersion": "1.15"}, False), ({"runtimeVersion": "2.0"}, False),
    ({"runtimeVersion": "2.1"}, True), ({"runtimeVersion": "2.11"}, True),
    ({"runtimeVersion": "1.15", "useChiefInTfConfig": True}, True),
    ({"runtimeVersion": "2.11", "useChiefInTfConfig": False}, False),
])
def test_use_chief_defaults_by_runtime_version(ti, use_chief):
    spec = resolve(ti)
    assert spec.use_chief is use_chief
    assert spec.training_input["useChiefInTfConfig"] is use_chief


def test_the_flag_names_the_chief_over_the_runtime(capsys, tmp_path, pkg):
    config = write_config(tmp_path, "trainingInput:\n  runtimeVersion: '1.15'\n")
    common = ["--job-dir", str(tmp_path / "job"), "--package-path", pkg, "--config", config]
    assert "master" in dry_run(capsys, "job01", *common)["cluster"]
    plan = dry_run(capsys, "job01", *common, "--use-chief-in-tf-config")
    assert "chief" in plan["cluster"] and "master" not in plan["cluster"]


# --- deadlines ------------------------------------------------------------------------

def test_scheduling_reaches_every_runner(capsys, tmp_path, pkg):
    config = write_config(tmp_path, "trainingInput:\n  scheduling:\n"
                          "    maxRunningTime: 7200s\n    maxWaitTime: 1800.5s\n")
    spec = resolve(specs.load_config(config))
    assert (spec.max_running_time, spec.max_wait_time) == (7200.0, 1800.5)
    common = ["--job-dir", "gs://mljob-test/jobdef/job01", "--package-path", pkg,
              "--config", config, "--dry-run"]
    status, out, err = run(capsys, "job01", *common, "--runner", "kubeflow",
                           "--namespace", "ml")
    assert status == 0, err
    policy = yaml.safe_load(out)["spec"]["runPolicy"]
    assert policy["activeDeadlineSeconds"] == 7200
    assert policy["schedulingPolicy"] == {"scheduleTimeoutSeconds": 1801}
    status, out, err = run(capsys, "job01", *common, "--runner", "vertex",
                           "--project", "my-project-123")
    assert status == 0, err
    scheduling = json.loads(out)["customJob"]["jobSpec"]["scheduling"]
    assert scheduling == {"timeout": "7200s", "maxWaitDuration": "1800.500s"}


# --- bad input: one line, exit 2, nothing written ---------------------------------------

HOSTILE = [
    (["--labels", "Team=vision"], "label key 'Team' is not a Google Cloud label key"),
    (["--labels", "9team=x"], "label key '9team' is not a Google Cloud label key"),
    (["--labels", "team"], "--labels 'team' is not KEY=VALUE"),
    (["--labels", "team=Vision"], "label team='Vision' has a value Google Cloud refuses"),
    (["--labels", "team=" + "x" * 64], "has a value Google Cloud refuses"),
    (["--labels", "mljob-job-id=x"], "which mljob keeps for its own labels"),
    (["--labels", ",".join(f"k{i}=v" for i in range(65))],
     "65 labels are more than Google Cloud's 64"),
    (["--scale-tier", "CUSTOM", "--master-machine-type", "standard",
      "--master-accelerator", "type=nvidia-tesla-t4"],
     "--master-accelerator 'type=nvidia-tesla-t4' has no count"),
    (["--scale-tier", "CUSTOM", "--master-machine-type", "standard",
      "--master-accelerator", "count=0,type=nvidia-tesla-t4"],
     "count='0' is not a number of GPUs from 1 to 99"),
    (["--scale-tier", "CUSTOM", "--master-machine-type", "standard",
      "--worker-count", "1", "--worker-accelerator", "count=1,kind=t4"],
     "'kind=t4' is not count=N or type=TYPE"),
    (["--master-machine-type", "n1-standard-4"],
     "--master-machine-type needs --scale-tier CUSTOM"),
    (["--scale-tier", "CUSTOM", "--master-machine-type", "huge"], "unknown masterType 'huge'"),
    (["--job-dir", "gs://b/x"], "'b' is not a valid bucket name (bucket names are 3 to 63"),
    (["--job-dir", "gs://My_Bucket/x"], "use only lower-case letters, digits"),
    (["--job-dir", "gs://google-data/x"], "cannot start with 'goog' or contain 'google'"),
    (["--job-dir", "gs://-bucket/x"], "start and end with a letter or digit"),
]
HOSTILE_CONFIG = [
    ("labels: [a, b]\n", "labels must be a mapping of KEY: VALUE"),
    ("labels:\n  Team: x\n", "labels in --config: label key 'Team' is not"),
    ("trainingInput:\n  scheduling:\n    maxRunningTime: 2h\n",
     "trainingInput.scheduling.maxRunningTime '2h' is not a duration"),
    ("trainingInput:\n  scheduling:\n    maxRunningTime: 0s\n", "is not a duration"),
    ("trainingInput:\n  scheduling:\n    maxWaitTime: 30\n",
     "trainingInput.scheduling.maxWaitTime 30 is not a duration"),
    ("trainingInput:\n  scheduling:\n    deadline: 30s\n",
     "trainingInput.scheduling has unknown key 'deadline'"),
    ("trainingInput:\n  runtimeVersion: latest\n",
     "trainingInput.runtimeVersion 'latest' is not a runtime version"),
]


@pytest.mark.parametrize("argv,message", HOSTILE, ids=[m for _, m in HOSTILE])
def test_bad_flags_are_one_line_and_write_nothing(capsys, tmp_path, pkg, argv, message):
    job_dir = tmp_path / "job"
    if "--job-dir" not in argv:
        argv = ["--job-dir", str(job_dir), *argv]
    status, out, err = run(capsys, "job01", "--package-path", pkg, *argv)
    assert status == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert files_under(job_dir) == []


@pytest.mark.parametrize("text,message", HOSTILE_CONFIG, ids=[m for _, m in HOSTILE_CONFIG])
def test_bad_config_is_one_line_and_writes_nothing(capsys, tmp_path, pkg, text, message):
    job_dir = tmp_path / "job"
    status, out, err = run(capsys, "job01", "--package-path", pkg, "--job-dir",
                           str(job_dir), "--config", write_config(tmp_path, text))
    assert status == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert files_under(job_dir) == []


def test_kubeflow_refuses_label_values_kubernetes_cannot_take(capsys, tmp_path, pkg):
    status, out, err = run(capsys, "job01", "--runner", "kubeflow", "--namespace", "ml",
                           "--job-dir", "gs://mljob-test/jobdef/job01", "--package-path",
                           pkg, "--labels", "team=vision-", "--dry-run")
    assert status == 2 and err.count("\n") == 1
    assert "label team=vision- cannot label a TFJob" in err


def test_vertex_leaves_room_for_its_own_labels(capsys, tmp_path, pkg):
    labels = ",".join(f"k{i}=v" for i in range(62))
    status, out, err = run(capsys, "job01", "--runner", "vertex", "--project",
                           "my-project-123", "--job-dir", "gs://mljob-test/jobdef/job01",
                           "--package-path", pkg, "--labels", labels, "--dry-run")
    assert status == 2 and err.count("\n") == 1
    assert "62 labels are too many for Vertex AI" in err


# --- job ids are unique in the index ---------------------------------------------------

def test_a_job_id_is_used_once_unless_resumed(capsys, tmp_path, pkg):
    common = ["--package-path", pkg, "--module-name", "fakejob.task"]
    first = str(tmp_path / "first")
    status, _, err = run(capsys, "job01", "--job-dir", first, *common)
    assert status == 0, err
    recorded = open(jobs.index_path("job01")).read()
    for argv in (["--job-dir", str(tmp_path / "second")],
                 ["--staging-bucket", str(tmp_path / "staging")]):
        status, _, err = run(capsys, "job01", *argv, *common)
        assert status == 2 and err.count("\n") == 1, err
        assert f"job id 'job01' already exists (SUCCEEDED, job dir {first}" in err
        assert f"--resume with --job-dir {first}" in err
        assert files_under(tmp_path / "second") == []
    status, _, err = run(capsys, "job01", "--job-dir", first, *common)
    assert status == 2 and "already used in" in err
    assert open(jobs.index_path("job01")).read() == recorded  # nothing replaced
    status, _, err = run(capsys, "job01", "--job-dir", first, "--resume", *common)
    assert status == 0, err


# --- jobs list --filter --sort-by --limit --------------------------------------------

def _index(*rows):
    for i, (job_id, state, labels) in enumerate(rows):
        jobs.save(jobs.JobRecord(job_id, state=state, create_time=1000.0 + i, labels=labels))


def test_jobs_list_filters_sorts_and_limits(capsys):
    _index(("job1", "SUCCEEDED", {"team": "vision"}), ("job12", "RUNNING", {"team": "vision"}),
           ("job2", "RUNNING", {"team": "speech"}), ("other", "FAILED", {}))

    def listed(*argv):
        status, out, err = run(capsys, "jobs", "list", *argv)
        assert status == 0, err
        return [line.split()[0] for line in out.splitlines()[1:]]

    assert listed() == ["job1", "job12", "job2", "other"]
    assert listed("--filter", "state=running") == ["job12", "job2"]
    assert listed("--filter", "labels.team=vision") == ["job1", "job12"]
    assert listed("--filter", "jobId:job1*") == ["job1", "job12"]
    assert listed("--filter", "jobId:job* AND labels.team=vision state=RUNNING") == ["job12"]
    assert listed("--sort-by", "~createTime") == ["other", "job2", "job12", "job1"]
    assert listed("--sort-by", "state,~jobId", "--limit", "3") == ["other", "job2", "job12"]


@pytest.mark.parametrize("argv,message", [
    (["--filter", "state"], "--filter 'state' is not KEY=VALUE or KEY:PATTERN"),
    (["--filter", "colour=red"], "--filter names unknown field 'colour'"),
    (["--sort-by", "colour"], "--sort-by names unknown field 'colour'"),
    (["--limit", "0"], "--limit 0 must be 1 or more"),
])
def test_jobs_list_mistakes_are_one_line(capsys, argv, message):
    _index(("job1", "SUCCEEDED", {}))
    status, out, err = run(capsys, "jobs", "list", *argv)
    assert status == 2 and err.count("\n") == 1 and message in err, err


# --- local GPUs: one CUDA_VISIBLE_DEVICES per replica ---------------------------------

def test_each_gpu_replica_gets_its_own_devices(tmp_path):
    from submit.local import plan as plans
    spec = resolve({"scaleTier": "CUSTOM", "masterType": "standard_gpu", "workerCount": 2,
                    "workerType": "n1-standard-8", "parameterServerCount": 1,
                    "parameterServerType": "standard",
                    "workerConfig": {"acceleratorConfig": {"count": 2,
                                                           "type": "NVIDIA_TESLA_T4"}}})
    package = Package(file_name="p-0.1.tar.gz", sha256="0" * 64, top_dir="p-0.1",
                      url="file:///p-0.1.tar.gz")

    def devices(available):
        plan = plans.build(spec, package, home=str(tmp_path), ports=[1, 2, 3, 4],
                           gpus_available=available)
        return {r.label: r.env.get("CUDA_VISIBLE_DEVICES") for r in plan.replicas}

    # start order: ps, workers, chief; the ps has no GPU and sees none
    assert devices(8) == {"ps-replica-0": "", "worker-replica-0": "0,1",
                          "worker-replica-1": "2,3", "master-replica-0": "4"}
    assert devices(2) == {"ps-replica-0": "", "worker-replica-0": "0,1",
                          "worker-replica-1": "0,1", "master-replica-0": "0"}
    assert set(devices(0).values()) == {None}   # no GPUs here: nothing is set
    cpu_only = resolve({"scaleTier": "CUSTOM", "masterType": "standard"})
    plan = plans.build(cpu_only, package, home=str(tmp_path), ports=[1],
                       gpus_available=4)
    assert "CUDA_VISIBLE_DEVICES" not in plan.replicas[0].env


# --- local CPU threads: replicas sharing the cores split them ---------------------------

def test_replicas_sharing_the_cores_get_their_share_of_intra_op_threads(tmp_path):
    from submit.local import plan as plans
    package = Package(file_name="p-0.1.tar.gz", sha256="0" * 64, top_dir="p-0.1",
                      url="file:///p-0.1.tar.gz")

    def threads(config, cores, environ=None, ports=4):
        plan = plans.build(resolve(config), package, home=str(tmp_path),
                           ports=list(range(1, ports + 1)), cores=cores,
                           environ=environ or {})
        return {r.label: r.env.get("TF_NUM_INTRAOP_THREADS") for r in plan.replicas}

    ps_job = {"scaleTier": "CUSTOM", "masterType": "standard", "workerCount": 2,
              "parameterServerCount": 1}
    # Under ps the chief only coordinates: the 2 workers share the cores.
    assert threads(ps_job, 2) == dict.fromkeys(
        ("ps-replica-0", "worker-replica-0", "worker-replica-1", "master-replica-0"), "1")
    assert set(threads(ps_job, 16).values()) == {"8"}
    # Multiworker: the chief trains too (3 replicas on 16 cores: 5 each).
    multi = {"scaleTier": "CUSTOM", "masterType": "standard", "workerCount": 2}
    assert set(threads(multi, 16, ports=3).values()) == {"5"}
    # One replica keeps TensorFlow's own pool; a value the user set wins.
    assert threads({"scaleTier": "BASIC"}, 2, ports=1) == {"master-replica-0": None}
    assert set(threads(ps_job, 2, {"TF_NUM_INTRAOP_THREADS": "4"}).values()) == {None}
