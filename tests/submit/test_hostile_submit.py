"""Hostile launcher inputs: job ids, config files, URLs the launcher cannot use, and
property-based tests of the config parser (any file or trainingInput gives a JobSpec or
the module's typed error, never another exception).

Each CLI case checks: exit status, one `error:` line on stderr and no traceback, nothing
staged or written (no job record, no package, no environment). The ordinary validation
cases (unknown keys, wrong types, YAML alias bombs, 1 MB files, counts out of range) are
in test_submit_spec.py::test_usage_errors_exit_2_and_stage_nothing.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.common import ROOT
from submit.jobdef import spec as specs
from submit.__main__ import main
from submit.errors import SubmitError
from tests.support.submit_cli import nothing_written, one_error_line, \
    write_package


@pytest.fixture
def pkg(tmp_path):
    return write_package(tmp_path / "pkg")


def submit(capsys, *argv) -> tuple[int, str]:
    status = main(list(argv), standalone_mode=False)
    out, err = capsys.readouterr()
    return status, err




# --- job ids ---------------------------------------------------------------------------

@pytest.mark.parametrize("job_id", [
    "../x", "job/../../etc", "job 01", " job01", "jöb01", "ジョブ", "j" * 200, "job01\n",
    "job\x00", "", "job.01", "job$(id)"],
    ids=["dot-dot", "path", "space", "leading space", "accent", "japanese", "200 chars",
         "newline", "NUL", "empty", "dot", "shell"])
def test_bad_job_ids_exit_2_and_write_nothing(capsys, tmp_path, pkg, job_id):
    status, err = submit(capsys, "submit", job_id, "--job-dir", str(tmp_path / "job"),
                         "--package-path", pkg)
    assert status == 2
    assert "invalid job id" in one_error_line(err)
    nothing_written(tmp_path / "job")


# --- config files ---------------------------------------------------------------------

CONFIGS = {
    "negative worker count": ("trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
                              "  workerCount: -3\n", "trainingInput.workerCount -3 is negative"),
    "negative ps count": ("trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
                          "  workerCount: 1\n  parameterServerCount: -1\n",
                          "trainingInput.parameterServerCount -1 is negative"),
    "huge count": ("trainingInput:\n  scaleTier: CUSTOM\n  masterType: standard\n"
                   "  workerCount: 100000000000000000000\n", "more than 10000 replicas per type"),
    "float count": ("trainingInput:\n  workerCount: 2.5\n", "must be an integer, not a number"),
    "null trainingInput": ("trainingInput:\n", "trainingInput must be a mapping, not NoneType"),
    "empty file": ("", "must be a mapping with a 'trainingInput' key, not NoneType"),
    "python tag": ("trainingInput: !!python/object/apply:os.system ['true']\n",
                   "is not valid YAML"),
    "billion laughs": ("x-a: &a ['lol','lol','lol','lol','lol','lol','lol','lol','lol']\n"
                       + "".join(f"x-{n}: &{n} [{', '.join(['*' + p] * 9)}]\n"
                                 for p, n in zip("abcdefgh", "bcdefghi", strict=True))
                       + "trainingInput: {args: *i}\n",
                       "its YAML aliases expand to more than 10000 values"),
    "self-referring alias": ("trainingInput: &t {args: [*t]}\n", "refers to the value that "
                                                                  "holds it"),
    "deep through aliases": ("x-a: &a " + "[" * 40 + "x" + "]" * 40 + "\n"
                             "trainingInput: {args: " + "[" * 20 + "*a" + "]" * 20 + "}\n",
                             "levels deep through aliases"),
    "deep nesting, unclosed": ("trainingInput: " + "[" * 50_000 + "\n", "--config"),
    "deep nesting": ("trainingInput: {args: " + "[" * 50_000 + "]" * 50_000 + "}\n",
                     "nests values more than 50 levels deep"),
    "deep mappings": ("trainingInput: " + "{a: " * 5_000 + "1" + "}" * 5_000 + "\n",
                      "nests values more than 50 levels deep"),
    "binary garbage": ("\x00\x01\x02\xff" * 100, "--config"),
    "tab indentation": ("trainingInput:\n\tscaleTier: BASIC\n", "is not valid YAML"),
    "args not strings": ("trainingInput:\n  args: [1, 2]\n", "args must be a list of strings"),
    "unknown replica config key": ("trainingInput:\n  workerConfig: {cpus: 4}\n",
                                   "workerConfig has unknown key 'cpus'"),
    "unknown restart policy": ("trainingInput:\n  workerConfig: {restartPolicy: Sometimes}\n",
                               "workerConfig.restartPolicy must be one of Never, OnFailure"),
    "negative maxRestarts": ("trainingInput:\n  masterConfig: {maxRestarts: -1}\n",
                             "masterConfig.maxRestarts must be an integer from 0 to 100"),
    "count below zero in accelerator": (
        "trainingInput:\n  masterConfig: {acceleratorConfig: {count: -1}}\n",
        "count must be a non-negative integer"),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_hostile_config_files_exit_2_and_write_nothing(capsys, tmp_path, pkg, name):
    text, words = CONFIGS[name]
    config = tmp_path / "config.yaml"
    config.write_bytes(text.encode("utf-8", "surrogateescape") if name != "binary garbage"
                       else text.encode("latin-1"))
    status, err = submit(capsys, "job01", "--job-dir", str(tmp_path / "job"),
                         "--package-path", pkg, "--config", str(config))
    assert status == 2
    assert words in one_error_line(err)
    nothing_written(tmp_path / "job")


def test_deeply_nested_json_config_exits_2(capsys, tmp_path, pkg):
    config = tmp_path / "config.json"
    config.write_text('{"trainingInput": {"args": ' + "[" * 50_000 + "]" * 50_000 + "}}")
    status, err = submit(capsys, "job01", "--job-dir", str(tmp_path / "job"),
                         "--package-path", pkg, "--config", str(config))
    assert status == 2 and "nests values too deeply" in one_error_line(err)
    nothing_written(tmp_path / "job")


@pytest.mark.parametrize("flags,words", [
    (["--restart-policy", "Sometimes"], "unknown --restart-policy 'Sometimes'; use one of "
                                        "Never"),
    (["--max-restarts", "101"], "--max-restarts 101 is out of range; use 0 to 100"),
    (["--max-restarts", "-1"], "--max-restarts -1 is out of range"),
])
def test_bad_restart_flags_exit_2(capsys, tmp_path, pkg, flags, words):
    status, err = submit(capsys, "job01", "--job-dir", str(tmp_path / "job"),
                         "--package-path", pkg, *flags)
    assert status == 2 and words in one_error_line(err)
    nothing_written(tmp_path / "job")


def test_missing_or_unreadable_config_is_a_usage_error(capsys, tmp_path, pkg):
    for path in (tmp_path / "nope.yaml", tmp_path):   # missing; a folder
        status, err = submit(capsys, "job01", "--job-dir", str(tmp_path / "job"),
                             "--package-path", pkg, "--config", str(path))
        assert status == 2 and "--config" in one_error_line(err)
    nothing_written(tmp_path / "job")


# --- URLs ------------------------------------------------------------------------------

@pytest.mark.parametrize("flag,url,words", [
    ("--job-dir", "s3://bucket/job", "unknown URL scheme 's3'"),
    ("--job-dir", "hdfs://namenode/job", "unknown URL scheme 'hdfs'"),
    ("--job-dir", "gs://", "names no bucket"),
    ("--job-dir", "gs:///job", "names no bucket"),
    ("--staging-bucket", "ftp://127.0.0.1/x", "unknown URL scheme 'ftp'"),
])
def test_unusable_url_schemes_exit_2(capsys, tmp_path, pkg, flag, url, words):
    argv = ["job01", "--package-path", pkg, flag, url]
    if flag != "--job-dir":
        argv += ["--job-dir", str(tmp_path / "job")]
    status, err = submit(capsys, *argv)
    assert status == 2 and words in one_error_line(err)
    nothing_written(tmp_path / "job")


def test_missing_bucket_fails_in_one_line_before_anything_runs(capsys, tmp_path, pkg,
                                                               gcs_emulator):
    status, err = submit(capsys, "job01", "--package-path", pkg, "--job-dir",
                         "gs://mljob-no-such-bucket/job01")
    assert status in (1, 2)
    line = one_error_line(err)
    assert "gs://mljob-no-such-bucket" in line and "bucket" in line
    assert not os.path.exists(os.path.join(os.environ["MLJOB_HOME"], "envs"))


@contextlib.contextmanager
def read_only(folder):
    """A folder this process cannot write: mode 555, and immutable when we are root
    (root ignores modes)."""
    os.chmod(folder, 0o555)
    immutable = os.geteuid() == 0 and shutil.which("chattr") and subprocess.run(
        ["chattr", "+i", str(folder)], capture_output=True).returncode == 0
    if os.geteuid() == 0 and not immutable:
        os.chmod(folder, 0o755)
        pytest.skip("running as root and chattr +i is not available: nothing is read-only")
    try:
        yield folder
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        os.chmod(folder, 0o755)


def test_read_only_job_dir_fails_in_one_line(capsys, tmp_path, pkg):
    folder = tmp_path / "ro"
    folder.mkdir()
    with read_only(folder):
        status, err = submit(capsys, "job01", "--package-path", pkg, "--job-dir",
                             str(folder / "job01"))
        assert status in (1, 2)
        line = one_error_line(err)
        assert str(folder) in line
        assert os.listdir(folder) == []
    assert not os.path.exists(os.path.join(os.environ["MLJOB_HOME"], "envs"))


def test_job_dir_under_a_file_fails_in_one_line(capsys, tmp_path, pkg):
    (tmp_path / "file").write_text("x")
    status, err = submit(capsys, "job01", "--package-path", pkg, "--job-dir",
                         str(tmp_path / "file" / "job01"))
    assert status in (1, 2)
    assert str(tmp_path / "file") in one_error_line(err)


def test_cli_in_a_real_process_prints_no_traceback(tmp_path):
    """The same refusals through `python -m submit`: exit 2, one line, no traceback."""
    config = tmp_path / "bomb.yaml"
    config.write_text(CONFIGS["billion laughs"][0])
    for argv in (["../x", "--job-dir", str(tmp_path / "j")],
                 ["job01", "--job-dir", str(tmp_path / "j"), "--config", str(config)],
                 ["job01", "--job-dir", "s3://b/j"]):
        out = subprocess.run([sys.executable, "-m", "submit", *argv], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, out.stderr
        one_error_line(out.stderr)
    assert not (tmp_path / "j").exists()


# --- the config parser, property-based ------------------------------------------------

KEYS = list(specs.TRAINING_INPUT_KEYS) + ["bogus", "workerCounts"]
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats()
    | st.text(max_size=12) | st.sampled_from(["CUSTOM", "BASIC", "STANDARD_1", "standard",
                                              "n1-standard-4", "standard_gpu", "gs://b/x",
                                              "s3://b", "memory://x", "job"]),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(
        st.sampled_from(["acceleratorConfig", "count", "type", "x"]), kids, max_size=3),
    max_leaves=12)
TRAINING_INPUTS = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=8)
SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


@SETTINGS
@given(ti=TRAINING_INPUTS, job_id=st.sampled_from(["job01", "../x", "j" * 200, "ジョブ"]))
def test_any_training_input_resolves_or_is_a_typed_error(ti, job_id):
    try:
        spec = specs.resolve(specs.Flags(job_id, staging_bucket="staging"),
                             specs.training_config(ti))
    except SubmitError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert specs.JOB_ID.fullmatch(spec.job_id)
    assert spec.count("chief") == 1
    for group in spec.groups:
        assert 0 < group.count <= specs.MAX_REPLICAS_PER_TYPE
    if spec.count("ps"):
        assert spec.count("worker")


@SETTINGS
@given(text=st.text(max_size=400)
       | st.builds(lambda d: yaml.safe_dump(d), st.dictionaries(
           st.sampled_from(["trainingInput", "labels", "jobId", "other"]),
           TRAINING_INPUTS | VALUES, max_size=3)))
def test_any_config_text_loads_or_is_a_config_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("cfg") / "config.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        ti = specs.load_config(str(path))
    except SubmitError as exc:
        assert str(exc) and "\n" not in str(exc).strip()
        return
    assert isinstance(ti, dict) and set(ti) <= set(specs.TRAINING_INPUT_KEYS)
