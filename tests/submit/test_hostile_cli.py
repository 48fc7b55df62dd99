"""Hostile command lines for `python -m submit`: control characters in trainer arguments
and other strings, relative and `..` URLs, and dry runs that must touch nothing. Each is
refused (exit 2, one `error:` line, nothing staged or recorded) or, for a dry run, printed
without reading anything remote or writing anything."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mljob.procs import free_ports
from tests.support.common import ROOT
from tests.support.submit_cli import dry_run, files_under, nothing_written, one_error_line, run




# --- control characters ----------------------------------------------------------------

@pytest.mark.parametrize("arg", ["--name=a\x00b", "a\nb", "\x1b[31mred", "x\x7f", "a\u2028b"],
                         ids=["NUL", "newline", "escape", "DEL", "line separator"])
def test_control_characters_in_trainer_args_are_refused_before_staging(capsys, tmp_path,
                                                                        pkg, arg):
    status, out, err = run(capsys, "job01", "--job-dir", str(tmp_path / "job"),
                           "--package-path", pkg, "--", "--steps", "3", arg)
    assert status == 2, err
    assert "trainer argument 3" in one_error_line(err)
    assert "holds the control character" in err
    nothing_written(tmp_path / "job")


@pytest.mark.parametrize("text,words", [
    ("trainingInput:\n  args: [\"--a\", \"b\\0c\"]\n", "trainingInput.args[1]"),
    ("trainingInput:\n  region: \"us\\ncentral1\"\n", "trainingInput.region"),
    ("trainingInput:\n  workerConfig: {\"restart\\tPolicy\": Never}\n",
     "trainingInput.workerConfig"),
], ids=["NUL in args", "newline in region", "tab in a key"])
def test_control_characters_in_config_strings_are_refused(capsys, tmp_path, pkg, text,
                                                          words):
    config = tmp_path / "config.yaml"
    config.write_text(text)
    status, _, err = run(capsys, "job01", "--job-dir", str(tmp_path / "job"),
                         "--package-path", pkg, "--config", str(config))
    assert status == 2
    line = one_error_line(err)
    assert words in line and "holds the control character" in line
    nothing_written(tmp_path / "job")


@pytest.mark.parametrize("flags,words", [
    (["--job-dir", "JOBDIR\n"], "--job-dir"),
    (["--staging-bucket", "gs://b/\x00x"], "--staging-bucket"),
    (["--runner", "vertex", "--project", "my-project", "--image", "img\x1b[2J"], "--image"),
    (["--runner", "kubeflow", "--namespace", "team\x00a"], "--namespace"),
], ids=["job dir", "staging bucket", "image", "namespace"])
def test_control_characters_in_flags_are_refused(capsys, tmp_path, pkg, flags, words):
    job_dir = str(tmp_path / "job")
    flags = [f.replace("JOBDIR", job_dir) for f in flags]
    if "--job-dir" not in flags:
        flags += ["--job-dir", job_dir if "--runner" not in flags else "gs://b/job"]
    status, _, err = run(capsys, "job01", "--package-path", pkg, *flags)
    assert status == 2
    line = one_error_line(err)
    assert words in line and "control character" in line
    nothing_written(tmp_path / "job")


# --- URLs: one absolute place, no `..` ---------------------------------------------------

def test_relative_file_urls_become_absolute(capsys, tmp_path, pkg, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = dry_run(capsys, "job01", "--job-dir", "file://out/job", "--package-path", pkg)
    assert plan["job_dir"] == f"file://{tmp_path}/out/job"
    assert plan["package_url"].startswith(f"file://{tmp_path}/out/job/packages/")
    assert plan["log_dir"] == f"{tmp_path}/out/job/logs"
    assert plan["trainer_args"][-2:] == ["--job-dir", f"file://{tmp_path}/out/job"]
    plan = dry_run(capsys, "job01", "--job-dir", "out/job", "--package-path", pkg)
    assert plan["job_dir"] == f"{tmp_path}/out/job"


@pytest.mark.parametrize("flag,url,words", [
    ("--job-dir", "file://", "names no folder"),
    ("--job-dir", "", "is empty"),
    ("--job-dir", "gs://bucket/job/../other", "has a '..' segment"),
    ("--job-dir", "memory://jobs/../x", "has a '..' segment"),
    ("--job-dir", "file:///tmp/a/../b", "has a '..' segment"),
    ("--staging-bucket", "gs://bucket/..", "has a '..' segment"),
    ("--job-dir", "３gs://bucket/job", "unknown URL scheme '３gs'"),
], ids=["empty file url", "empty", "gs dot-dot", "memory dot-dot", "file dot-dot",
        "staging dot-dot", "full-width scheme"])
def test_unusable_urls_are_refused(capsys, tmp_path, pkg, flag, url, words):
    argv = ["job01", "--package-path", pkg, flag, url]
    if flag != "--job-dir":
        argv += ["--job-dir", str(tmp_path / "job")]
    status, _, err = run(capsys, *argv)
    assert status == 2
    assert words in one_error_line(err)
    nothing_written(tmp_path / "job")


def test_dot_dot_in_a_package_uri_is_refused(capsys, tmp_path, pkg):
    config = tmp_path / "config.yaml"
    config.write_text("trainingInput:\n  packageUris: [gs://bucket/a/../pkg-1.0.tar.gz]\n")
    status, _, err = run(capsys, "job01", "--job-dir", str(tmp_path / "job"),
                         "--config", str(config))
    assert status == 2 and "has a '..' segment" in one_error_line(err)


# --- dry runs touch nothing --------------------------------------------------------------

@pytest.mark.parametrize("runner", [[], ["--runner", "vertex", "--project", "my-project"]],
                         ids=["local", "vertex"])
def test_dry_run_reads_nothing_remote_and_writes_nothing(tmp_path, pkg, runner):
    """Storage points at a port nothing listens on: any contact would fail, retry and
    warn. The dry run prints the plan, exit 0, and leaves no file anywhere."""
    home = tmp_path / "home"
    env = {**os.environ, "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{free_ports(1)[0]}",
           "MLJOB_HOME": str(home), "MLJOB_STORAGE_RETRIES": "1",
           "MLJOB_STORAGE_REQUEST_RETRIES": "1"}
    config = tmp_path / "config.yaml"
    config.write_text("trainingInput:\n  packageUris: [gs://bucket/pkg/fakejob-0.1.tar.gz]\n")
    for extra in (["--package-path", pkg], ["--config", str(config)],
                  ["--package-path", pkg, "--staging-bucket", "gs://stage/x"]):
        out = subprocess.run([sys.executable, "-m", "submit", "job01", "--job-dir",
                              "gs://bucket/job", "--dry-run", *extra, *runner], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert out.stderr == ""
        printed = json.loads(out.stdout)
        assert "gs://bucket/job" in json.dumps(printed)
        if "--config" in extra:
            assert "gs://bucket/pkg/fakejob-0.1.tar.gz" in out.stdout
    assert files_under(home) == []


# --- config files: repeated keys, encodings, types, base-60 numbers -------------------------

CUSTOM = "trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
CONFIGS = {
    "repeated trainingInput": ("config.yaml", "trainingInput:\n  workerCount: 1\n"
                               "trainingInput:\n  scaleTier: BASIC\n",
                               "line 3 repeats the key 'trainingInput'"),
    "repeated nested key": ("config.yaml", CUSTOM + "  workerCount: 1\n  workerCount: 2\n",
                            "line 5 repeats the key 'workerCount'"),
    "repeated JSON key": ("config.json", '{"trainingInput": {"scaleTier": "BASIC", '
                          '"scaleTier": "CUSTOM"}}', "repeats the key 'scaleTier'"),
    "not UTF-8": ("config.yaml", b"trainingInput:\n  region: caf\xe9\n",
                  "is not UTF-8 text (byte 0xe9 at offset 28); save it as UTF-8"),
    "labels a list": ("config.yaml", "labels: [a, b]\n",
                      "labels must be a mapping of KEY: VALUE, not a list ['a', 'b']"),
    # a whole number is a label value as written (`version: 2`); other kinds are not
    "label value a float": ("config.yaml", "labels: {team: 5.5}\n",
                            "label team's value must be a string, not a number"),
    "jobId a number": ("config.yaml", "jobId: 5\n", "jobId must be a string like job01, not "
                       "an integer"),
    "jobId a path": ("config.yaml", "jobId: ../x\n", "invalid job id '../x'"),
    "accelerator type a number": ("config.yaml", "trainingInput:\n  masterConfig:\n"
                                  "    acceleratorConfig: {count: 1, type: 4}\n",
                                  "acceleratorConfig.type must be a string like "
                                  "NVIDIA_TESLA_T4, not an integer 4"),
    "base-60 count": ("config.yaml", CUSTOM + "  workerCount: 1:30\n",
                      "trainingInput.workerCount must be an integer, not a string '1:30'"),
    "negative base-60 count": ("config.yaml", CUSTOM + "  workerCount: -1:30\n",
                               "trainingInput.workerCount must be an integer, not a string "
                               "'-1:30'"),
    "negative count": ("config.yaml", CUSTOM + "  workerCount: -3\n",
                       "trainingInput.workerCount -3 is negative"),
    "count with a fixed tier": ("config.yaml", "trainingInput:\n  workerCount: 2\n",
                                "trainingInput.workerCount needs --scale-tier CUSTOM"),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_hostile_config_files_are_one_line(capsys, tmp_path, pkg, name):
    file_name, text, words = CONFIGS[name]
    config = tmp_path / file_name
    if isinstance(text, str):
        text = text.encode()
    config.write_bytes(text)
    status, _, err = run(capsys, "job01", "--job-dir", str(tmp_path / "job"),
                         "--package-path", pkg, "--config", str(config))
    assert status == 2
    line = one_error_line(err)
    assert words in line
    assert "--worker-count" not in line  # no flag the user did not write
    nothing_written(tmp_path / "job")


def test_a_storage_error_names_its_url_once(capsys, tmp_path):
    folder = tmp_path / "not-a-package.tar.gz"
    folder.mkdir()
    config = tmp_path / "config.yaml"
    config.write_text(f"trainingInput:\n  packageUris: [file://{folder}]\n")
    status, _, err = run(capsys, "job01", "--job-dir", str(tmp_path / "job"),
                         "--config", str(config))
    assert status == 1
    line = one_error_line(err)
    assert line.count(str(folder)) == 1 and "cannot download the package" in line


# --- jobs stream-logs --task-name ------------------------------------------------------------

def test_stream_logs_of_a_replica_the_job_does_not_have_exits_2(capsys, tmp_path):
    logs = Path(os.environ["MLJOB_HOME"], "runs", "job01", "logs")  # the job's own
    logs.mkdir(parents=True)
    (logs / "master-replica-0.log").write_text("INFO\tt\tmaster-replica-0\thello\n")
    index = os.path.join(os.environ["MLJOB_HOME"], "jobs")
    os.makedirs(index)
    with open(os.path.join(index, "job01.json"), "w") as f:
        json.dump({"job_id": "job01", "state": "SUCCEEDED", "log_dir": str(logs),
                   "replicas": [{"label": "master-replica-0", "state": "EXITED"}]}, f)
    for task_name in ("worker-replica-5", "chief-0", "master-replica-0\n"):
        status, out, err = run(capsys, "jobs", "stream-logs", "job01", "--task-name",
                               task_name)
        assert status == 2 and out == ""
        assert "names no replica of job job01; use one of master-replica-0, or service " \
            "for the supervisor's events" in one_error_line(err)
    status, out, _ = run(capsys, "jobs", "stream-logs", "job01", "--task-name",
                         "master-replica-0")
    assert status == 0 and "\tmaster-replica-0\thello" in out


@pytest.mark.parametrize("where", ["elsewhere", "job dir without its record", "via .."])
def test_a_records_log_dir_outside_the_jobs_own_folders_is_not_read(capsys, tmp_path,
                                                                      where):
    """A hand-edited record's log_dir (`/var/log`) is never followed: only the job's own
    folders are read, and `jobs stream-logs` says so in one line."""
    secret = tmp_path / "logs"  # also where a job dir's logs would be
    secret.mkdir()
    (secret / "master-replica-0.log").write_text("INFO\tt\tmaster-replica-0\tSECRET\n")
    home = Path(os.environ["MLJOB_HOME"])
    log_dir = {"elsewhere": secret, "job dir without its record": secret,
               "via ..": home / "runs" / "job01" / "logs" / ".." / ".." / ".." / ".." /
               secret.relative_to("/")}[where]
    (home / "jobs").mkdir(parents=True)
    (home / "jobs" / "job01.json").write_text(json.dumps({
        "job_id": "job01", "state": "SUCCEEDED", "log_dir": str(log_dir),
        "job_dir": str(tmp_path) if where != "elsewhere" else None,
        "replicas": [{"label": "master-replica-0", "state": "EXITED"}]}))
    status, out, err = run(capsys, "jobs", "stream-logs", "job01")
    assert status != 0 and "SECRET" not in out + err
    assert "which is none of the job's own folders; nothing there is read" in \
        one_error_line(err)
