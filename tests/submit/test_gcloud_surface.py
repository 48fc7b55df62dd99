"""gcloud ai-platform's command surface, as users copy it from Cloud ML's docs and scripts:
`jobs submit training`, reserved words and job ids, enum spellings, `--flag=true|false`,
int64 strings and YAML anchors in configs, `--format` on `jobs list/describe`, `--uri`,
`--summarize`, and `jobs update`'s labels."""
from __future__ import annotations

import json
import os

import pytest
import yaml

from submit.cli import cmd_submit
from submit import jobs as records, resource
from submit.jobdef import spec as specs
from submit.cli.cli_base import gcloud_booleans
from tests.support.submit_cli import dry_run, nothing_written, one_error_line, run, \
    write_package
from tests.support.trainer_runs import SAMPLE

QUICK_TASK = "import sys, time\nprint('step 1/1 loss=0.5', flush=True)\ntime.sleep(0.2)\n"


@pytest.fixture
def pkg(tmp_path):
    return write_package(tmp_path / "pkg", QUICK_TASK)


def submit_quick(capsys, tmp_path, pkg, job_id, *extra):
    status, out, err = run(capsys, "jobs", "submit", "training", job_id, "--job-dir",
                           str(tmp_path / job_id), "--package-path", pkg,
                           "--module-name", "fakejob.task", *extra)
    assert status == 0, err
    return out


# --- commands, reserved words, job ids ---------------------------------------------

@pytest.mark.parametrize("argv,words", [
    (["models", "--job-dir", "x", "--dry-run"], "No such option '--job-dir'"),  # a group
    (["Models", "--job-dir", "x"], "'Models' is a gcloud ai-platform command"),
    (["explain", "job01"], "'explain' is a gcloud ai-platform command"),
    (["operations"], "'operations' is a gcloud ai-platform command"),
    (["jobs", "submit", "training", "jobs", "--job-dir", "x"],
     "'jobs' is a command's name, never a job id; pick another, e.g. jobs_1"),
    (["jobs", "submit", "training", "Versions", "--job-dir", "x"], "e.g. Versions_1"),
    (["my-job.1", "--job-dir", "x"], "invalid job id 'my-job.1'"),
    (["jobs", "submit", "training", "my-job.1", "--job-dir", "x"], "e.g. my_job_1"),
    (["jobs", "submit", "training", "2024_run", "--job-dir", "x"], "e.g. job_2024_run"),
    (["jobs", "describe", "a b"], "e.g. a_b"),
    (["jobs", "submit", "training", "job01\n", "--job-dir", "x"], "e.g. job01"),
])
def test_reserved_words_and_bad_job_ids_are_one_line_with_a_valid_spelling(
        capsys, tmp_path, argv, words):
    os.chdir(tmp_path)
    status, out, err = run(capsys, *argv)
    assert status == 2 and out == ""
    assert words in one_error_line(err)
    nothing_written(tmp_path)


def test_jobs_submit_is_a_group_of_kinds(capsys):
    status, out, err = run(capsys, "jobs", "submit")   # a bare group: its help
    assert status == 2 and "training" in err
    status, out, err = run(capsys, "jobs", "submit", "training", "--help")
    assert status == 0 and "--master-image-uri" in out and "--scale-tier" in out


# --- gcloud's spellings --------------------------------------------------------------

@pytest.mark.parametrize("given,tier", [("standard-1", "STANDARD_1"),
                                        ("standard_1", "STANDARD_1"),
                                        ("Premium-1", "PREMIUM_1"), ("basic", "BASIC"),
                                        ("CUSTOM", "CUSTOM")])
def test_scale_tiers_in_every_gcloud_spelling(given, tier):
    extra = {"masterType": "standard"} if tier == "CUSTOM" else {}
    assert specs.resolve(specs.Flags("job01", job_dir="/tmp/j"), specs.training_config(
        {"scaleTier": given, **extra})).scale_tier == tier
    assert specs.resolve(specs.Flags("job01", scale_tier=given, job_dir="/tmp/j"),
                         specs.training_config(extra)).scale_tier == tier


def test_a_scale_tier_flag_in_gcloud_spelling_reaches_the_plan(capsys, tmp_path, pkg):
    plan = dry_run(capsys, "jobs", "submit", "training", "job01", "--scale-tier",
                   "standard-1", "--job-dir", str(tmp_path / "j"), "--package-path", pkg)
    assert plan["scale_tier"] == "STANDARD_1" and len(plan["cluster"]["worker"]) == 4


@pytest.mark.parametrize("given", ["basic-gpu", "BASIC_GPU", "basic_gpu"])
def test_gpu_tier_spellings_reach_the_gpu_check(capsys, tmp_path, pkg, given):
    status, _, err = run(capsys, "job01", "--scale-tier", given, "--job-dir",
                         str(tmp_path / "j"), "--package-path", pkg, "--dry-run")
    assert status == 2 and "scale tier BASIC_GPU needs 1 GPU(s)" in one_error_line(err)


@pytest.mark.parametrize("flag,chief", [("--use-chief-in-tf-config=true", True),
                                        ("--use-chief-in-tf-config=FALSE", False)])
def test_boolean_flags_take_true_and_false(capsys, tmp_path, pkg, flag, chief):
    plan = dry_run(capsys, "job01", "--job-dir", str(tmp_path / "j"), "--package-path",
                   pkg, "--runtime-version", "1.15", flag)
    assert plan["training_input"]["useChiefInTfConfig"] is chief


def test_boolean_spellings_become_click_flags():
    command = cmd_submit.training_command
    assert gcloud_booleans(command, ["--no-use-chief-in-tf-config=false"]) == [
        "--use-chief-in-tf-config"]
    assert gcloud_booleans(command, ["--no-use-chief-in-tf-config=true", "--dry-run=0"]) \
        == ["--no-use-chief-in-tf-config"]
    assert gcloud_booleans(command, ["--stream-logs=false", "--resume=yes", "--"]) == [
        "--async", "--resume", "--"]
    assert gcloud_booleans(command, ["--job-dir=a=true", "--", "--dry-run=true"]) == [
        "--job-dir=a=true", "--", "--dry-run=true"]


def test_stream_logs_false_is_async_and_bad_booleans_are_refused(capsys, tmp_path, pkg):
    status, out, err = run(capsys, "job01", "--job-dir", "memory://x", "--package-path",
                           pkg, "--stream-logs=false")
    assert status == 2 and "--async cannot use a memory:// job dir" in one_error_line(err)
    status, out, err = run(capsys, "job01", "--job-dir", str(tmp_path / "j"),
                           "--package-path", pkg, "--dry-run=maybe")
    assert status == 2
    assert "--dry-run takes true or false, not 'maybe'" in one_error_line(err)
    # after `--`, words are the trainer's, untouched
    plan = dry_run(capsys, "job01", "--job-dir", str(tmp_path / "j"), "--package-path",
                   pkg, "--", "--use-chief-in-tf-config=true")
    assert plan["training_input"]["args"] == ["--use-chief-in-tf-config=true"]


def test_int64_strings_and_anchors_in_config(capsys, tmp_path, pkg):
    config = tmp_path / "config.yaml"
    config.write_text(
        "x-machine: &machine n1-standard-4\n"
        "x-replica: &replica\n  restartPolicy: OnFailure\n  maxRestarts: 2\n"
        "trainingInput:\n  scaleTier: custom\n  masterType: *machine\n"
        "  workerType: *machine\n  workerCount: '2'\n  parameterServerCount: \"1\"\n"
        "  workerConfig:\n    <<: *replica\n    acceleratorConfig: {count: '0', type: T}\n"
        "  parameterServerConfig: *replica\n")
    plan = dry_run(capsys, "job01", "--job-dir", str(tmp_path / "j"), "--package-path",
                   pkg, "--config", str(config))
    ti = plan["training_input"]
    assert (ti["workerCount"], ti["parameterServerCount"]) == (2, 1)
    assert ti["workerType"] == ti["masterType"] == "n1-standard-4"
    assert ti["workerConfig"]["restartPolicy"] == "OnFailure"
    assert ti["workerConfig"]["acceleratorConfig"]["count"] == 0
    assert len(plan["cluster"]["worker"]) == 2 and len(plan["cluster"]["ps"]) == 1


@pytest.mark.parametrize("text,words", [
    ("trainingInput: {workerCount: '2.0'}\n", "workerCount must be an integer, not a string"),
    ("trainingInput: {workerCount: '1e3'}\n", "workerCount must be an integer, not a string"),
    ("trainingInput: {workerCount: '9223372036854775808'}\n", "out of int64's range"),
    ("trainingInput: {scaleTier: CUSTOM, masterType: standard, workerCount: '-2'}\n",
     "trainingInput.workerCount -2 is negative"),
    ("x-a: &a [1]\ntrainingInput: {args: *a}\n", "args must be a list of strings"),
    ("y-a: &a 1\ntrainingInput: {}\n", "has unknown key 'y-a'"),
])
def test_config_spelling_mistakes_are_one_line(capsys, tmp_path, pkg, text, words):
    config = tmp_path / "config.yaml"
    config.write_text(text)
    status, _, err = run(capsys, "job01", "--job-dir", str(tmp_path / "j"),
                         "--package-path", pkg, "--config", str(config))
    assert status == 2 and words in one_error_line(err)
    assert not (tmp_path / "j").exists()


# --- --format, --uri, --summarize -----------------------------------------------------

def test_describe_and_list_print_cloud_mls_job_resource(capsys, tmp_path, pkg):
    submit_quick(capsys, tmp_path, pkg, "job01", "--scale-tier", "custom",
                 "--master-machine-type", "standard", "--worker-count", "1",
                 "--labels", "team=vision", "--", "--epochs", "1")
    submit_quick(capsys, tmp_path, pkg, "job02", "--labels", "team=audio")

    status, out, err = run(capsys, "jobs", "describe", "job01", "--format", "json")
    assert status == 0 and err == ""  # no hints with --format
    job = json.loads(out)
    assert job["jobId"] == "job01" and job["state"] == "SUCCEEDED"
    assert job["labels"] == {"team": "vision"}
    for key in ("createTime", "startTime", "endTime"):
        assert job[key].endswith("Z") and job[key][10] == "T"  # RFC 3339, UTC
    assert job["createTime"] <= job["startTime"] <= job["endTime"]
    ti = job["trainingInput"]
    assert ti["workerCount"] == "1" and ti["scaleTier"] == "CUSTOM"   # int64 as strings
    assert ti["args"] == ["--epochs", "1"] and ti["pythonModule"] == "fakejob.task"
    assert ti["packageUris"][0].endswith(".tar.gz")
    own = job["mljob"]
    assert own["runner"] == "local" and own["logDir"]
    assert sorted(r["label"] for r in own["replicas"]) == ["master-replica-0",
                                                           "worker-replica-0"]
    assert {"exitCode", "restarts", "pid", "state"} <= own["replicas"][0].keys()
    assert not any("_" in key for key in _keys(job))   # camelCase throughout
    assert "stamp" not in json.dumps(job) and "supervisorStamp" not in own

    status, out, err = run(capsys, "jobs", "describe", "job01")   # default: YAML
    assert status == 0 and yaml.safe_load(out) == job
    assert "python -m submit jobs stream-logs job01" in err and "tensorboard" in err

    status, out, _ = run(capsys, "jobs", "describe", "job01", "--format",
                         "value(state,labels.team,trainingInput.workerCount)")
    assert out == "SUCCEEDED\tvision\t1\n"
    status, out, _ = run(capsys, "jobs", "list", "--format", "value(jobId)",
                         "--sort-by", "~jobId")
    assert out.split() == ["job02", "job01"]
    status, out, _ = run(capsys, "jobs", "list", "--format", "json",
                         "--filter", "labels.team=audio")
    assert [j["jobId"] for j in json.loads(out)] == ["job02"]
    status, out, _ = run(capsys, "jobs", "list", "--format", "yaml")
    assert [d["jobId"] for d in yaml.safe_load_all(out)] == ["job01", "job02"]
    status, out, _ = run(capsys, "jobs", "list", "--format",
                         "table(jobId:label=NAME,state,mljob.runner)")
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "STATE", "RUNNER"]
    assert lines[1].split() == ["job01", "SUCCEEDED", "local"]
    status, out, _ = run(capsys, "jobs", "list", "--format", "table")
    assert out.splitlines()[0].split() == ["JOB_ID", "STATUS", "CREATED"]
    status, out, _ = run(capsys, "jobs", "list", "--uri")
    assert out.split() == [f"file://{tmp_path}/job01/jobs/job01.json",
                           f"file://{tmp_path}/job02/jobs/job02.json"]
    status, out, _ = run(capsys, "jobs", "describe", "job01", "--summarize")
    assert status == 0
    assert out.startswith("Job Overview\nJOB_ID")
    assert "Training Input Summary" in out and "Replicas" in out
    assert "worker-replica-0" in out


def _keys(value):
    if isinstance(value, dict):
        for k, v in value.items():
            if k not in ("labels", "hyperparameters"):
                yield k
                yield from _keys(v)
    elif isinstance(value, list):
        for v in value:
            yield from _keys(v)


@pytest.mark.parametrize("argv,words", [
    (["jobs", "list", "--format", "xml"], "--format 'xml' is not one mljob prints"),
    (["jobs", "list", "--format", "value()"], "--format value needs keys"),
    (["jobs", "list", "--format", "json(jobId)"], "--format json takes no keys"),
    (["jobs", "list", "--format", "table(jobId:width=3)"], "only ':label=NAME'"),
    (["jobs", "list", "--format", "value(job id)"], "is not a dotted key"),
    (["jobs", "list", "--format", "json", "--uri"], "--uri and --format both"),
    (["jobs", "describe", "job01", "--summarize", "--format", "json"],
     "--summarize and --format both"),
    (["jobs", "update", "job01"], "nothing to update"),
    (["jobs", "update", "job01", "--clear-labels", "--remove-labels", "a"],
     "give at most one of them"),
    (["jobs", "update", "job01", "--update-labels", "Team=x"], "is not a Google Cloud label"),
    (["jobs", "update", "job01", "--update-labels", "team"], "is not KEY=VALUE"),
    (["jobs", "update", "job01", "--update-labels", "mljob-x=1"], "mljob keeps for its own"),
    (["jobs", "update", "nojob", "--clear-labels"], "no job 'nojob' in the local index"),
])
def test_format_and_update_mistakes_are_one_line(capsys, tmp_path, argv, words):
    record = records.JobRecord("job01", job_dir=str(tmp_path / "job01"),
                               labels={"team": "vision"})
    record.set_state(records.SUCCEEDED)
    records.save(record)
    before = open(records.index_path("job01")).read()
    status, out, err = run(capsys, *argv)
    assert status == 2 and out == ""
    assert words in one_error_line(err)
    assert open(records.index_path("job01")).read() == before
    assert not os.path.exists(resource.labels_path("job01"))


# --- jobs update ---------------------------------------------------------------------

def test_jobs_update_labels_as_gcloud_orders_them(capsys, tmp_path, pkg):
    submit_quick(capsys, tmp_path, pkg, "job01", "--labels", "team=vision,env=dev")

    def labels(*argv):
        status, out, err = run(capsys, "jobs", "update", "job01", *argv)
        assert status == 0 and out == "Updated job [job01].\n", err
        status, out, _ = run(capsys, "jobs", "describe", "job01", "--format", "json")
        return json.loads(out)["labels"]

    assert labels("--update-labels", "env=prod,owner=ana") == {
        "team": "vision", "env": "prod", "owner": "ana"}
    # --update-labels first, then --remove-labels; a missing key is ignored
    assert labels("--update-labels", "cost=1", "--remove-labels", "cost,owner,nosuch") == {
        "team": "vision", "env": "prod"}
    # --clear-labels first, then --update-labels
    assert labels("--clear-labels", "--update-labels", "foo=bar") == {"foo": "bar"}
    assert labels("--clear-labels") == {}
    # the finished job's record (index and job dir) carries them; list filters on them
    labels("--update-labels", "team=speech")
    assert records.load("job01").labels == {"team": "speech"}
    with open(tmp_path / "job01" / "jobs" / "job01.json") as f:
        assert json.load(f)["labels"] == {"team": "speech"}
    status, out, _ = run(capsys, "jobs", "list", "--filter", "labels.team=speech",
                         "--format", "value(jobId)")
    assert out == "job01\n"


# --- the real trainer ----------------------------------------------------------------

@pytest.mark.slow
def test_real_trainer_through_jobs_submit_training_then_describe_and_update(
        capsys, tmp_path):
    job_dir = str(tmp_path / "job")
    status, out, err = run(capsys, "jobs", "submit", "training", "real01", "--scale-tier",
                           "basic", "--job-dir", job_dir, "--stream-logs=true",
                           "--labels", "team=vision", "--", "--model", "mlp",
                           "--data-dir", SAMPLE, "--train-steps", "5", "--batch-size",
                           "32", "--seed", "1")
    assert status == 0, err[-3000:]
    assert "Job [real01] SUCCEEDED." in out
    assert os.path.exists(os.path.join(job_dir, "model", "saved_model.pb"))
    status, out, err = run(capsys, "jobs", "update", "real01", "--update-labels",
                           "stage=done")
    assert status == 0, err
    status, out, _ = run(capsys, "jobs", "describe", "real01", "--format", "json")
    job = json.loads(out)
    assert job["state"] == "SUCCEEDED" and job["labels"] == {"team": "vision",
                                                             "stage": "done"}
    assert job["trainingInput"]["scaleTier"] == "BASIC"
    assert job["trainingInput"]["jobDir"] == job_dir
    master = job["mljob"]["replicas"][0]
    assert (master["label"], master["exitCode"]) == ("master-replica-0", 0)


@pytest.mark.slow
def test_jobs_update_on_a_running_local_job_leaves_the_supervisors_record(
        capsys, tmp_path, monkeypatch):
    """A running job's record is its supervisor's to write: the new labels are kept
    beside the index and win from then on, through the job's end."""
    import signal
    import time
    pkg = write_package(tmp_path / "slow", "import time\nprint('step 1/1', flush=True)\n"
                                           "time.sleep(120)\n")
    status, out, err = run(capsys, "run01", "--job-dir", str(tmp_path / "run01"),
                           "--package-path", pkg, "--module-name", "fakejob.task",
                           "--labels", "team=vision", "--async")
    assert status == 0, err
    record = records.load("run01")
    try:
        deadline = time.monotonic() + 60
        while records.load("run01").state != records.RUNNING:
            assert time.monotonic() < deadline, "the job never ran"
            time.sleep(0.2)
        status, out, err = run(capsys, "jobs", "update", "run01", "--update-labels",
                               "stage=train")
        assert status == 0, err
        assert records.load("run01").labels == {"team": "vision"}   # not ours to write
        status, out, _ = run(capsys, "jobs", "list", "--filter", "labels.stage=train",
                             "--format", "value(jobId,state,labels.team)")
        assert out == "run01\tRUNNING\tvision\n"
        status, out, err = run(capsys, "jobs", "cancel", "run01")
        assert status == 0, err
        status, out, _ = run(capsys, "jobs", "describe", "run01", "--format", "json")
        job = json.loads(out)
        assert job["state"] == "CANCELLED"
        assert job["labels"] == {"team": "vision", "stage": "train"}
    finally:
        try:
            os.killpg(record.supervisor_pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, TypeError):
            pass
