"""Hostile inputs, third round, on the launcher's side: grids and numbers that would cost
gigabytes or overflow, parallel trials beyond a cap, resumePreviousJobId checked before
anything is written, and damaged or foreign files in the job index."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import yaml

from submit import jobs as records
from submit.jobdef import tuning_spec
from submit.errors import ConfigError
from tests.support.peak import run_measured
from tests.support.submit_cli import nothing_written, one_error_line, run, write_package

INTEGER = {"parameterName": "units", "type": "INTEGER", "minValue": 1, "maxValue": 10}


def _hp(**fields):
    hp = {"goal": "MAXIMIZE", "maxTrials": 4, "params": [dict(INTEGER)]}
    hp.update(fields)
    return hp


def test_a_grid_of_a_billion_points_is_refused_without_being_built():
    """Before: GRID_SEARCH over an INTEGER range of 10^9 built the grid as a list (a
    MemoryError, or gigabytes). The refusal is measured: the child stays small."""
    result = run_measured("""
        from submit.jobdef import tuning_spec
        hp = {"goal": "MAXIMIZE", "maxTrials": 4, "algorithm": "GRID_SEARCH",
              "params": [{"parameterName": "units", "type": "INTEGER", "minValue": 1,
                          "maxValue": 10 ** 9}]}
        tuning_spec.parse(hp, job_dir="/jobs/x")
    """, limit_mb=1024)
    assert result["error"] == ("ConfigError: trainingInput.hyperparameters: GRID_SEARCH over "
                               "1,000,000,000 points is more than the limit of 100000; "
                               "narrow the INTEGER ranges or list fewer values, or use "
                               "RANDOM_SEARCH"), result
    assert result["peak_mb"] < 200, result


def test_grid_size_is_computed_and_a_grid_at_the_limit_is_taken():
    hp = _hp(algorithm="GRID_SEARCH", params=[
        dict(INTEGER, minValue=1, maxValue=1000),
        {"parameterName": "d", "type": "DISCRETE", "discreteValues": list(range(100))}])
    spec = tuning_spec.parse(hp, job_dir="/jobs/x")
    assert spec.grid_size() == 100_000 == tuning_spec.MAX_GRID_POINTS
    hp["params"][1]["discreteValues"].append(100)
    with pytest.raises(ConfigError, match="GRID_SEARCH over 101,000 points"):
        tuning_spec.parse(hp, job_dir="/jobs/x")


@pytest.mark.parametrize("param, words", [
    (dict(INTEGER, minValue=-10 ** 400), "minValue must be an integer within ±2^53, not an "
                                         "integer of 1329 bits"),
    (dict(INTEGER, maxValue=2 ** 53 + 1), "maxValue must be an integer within ±2^53"),
    ({"parameterName": "d", "type": "DISCRETE", "discreteValues": [1, 10 ** 400]},
     "discreteValues must be a non-empty list of numbers (finite; integers within ±2^53)"),
    ({"parameterName": "x", "type": "DOUBLE", "minValue": 0, "maxValue": 10 ** 400},
     "maxValue must be a finite number, not an integer of 1329 bits"),
], ids=["int-min", "int-max", "discrete", "double"])
def test_integers_that_overflow_a_float_are_one_line(param, words):
    """Before: OverflowError (int too large to convert to float), a traceback."""
    with pytest.raises(ConfigError) as info:
        tuning_spec.parse(_hp(params=[param]), job_dir="/jobs/x")
    assert words in str(info.value) and "\n" not in str(info.value)


def test_a_huge_integer_bound_in_a_config_file_is_one_line(capsys, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"trainingInput": {"hyperparameters": _hp(
        params=[dict(INTEGER, maxValue=10 ** 400)])}}))
    status, _, err = run(capsys, "tune01", "--job-dir", str(tmp_path / "job"),
                         "--package-path", write_package(tmp_path / "pkg"),
                         "--config", str(config))
    assert status == 2 and "maxValue must be an integer within ±2^53" in one_error_line(err)
    nothing_written(tmp_path / "job")


def test_parallel_trials_are_capped_and_the_cap_is_named(capsys, tmp_path):
    """Before: maxTrials and maxParallelTrials of 10000 were taken, and the local runner
    started as many trials at once as it was told."""
    with pytest.raises(ConfigError, match="maxParallelTrials must be an integer from 1 to "
                                          "100, not 10000$"):
        tuning_spec.parse(_hp(maxTrials=10000, maxParallelTrials=10000), job_dir="/j")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"trainingInput": {"hyperparameters": _hp(
        maxTrials=40, maxParallelTrials=17)}}))
    status, _, err = run(capsys, "tune01", "--job-dir", str(tmp_path / "job"),
                         "--package-path", write_package(tmp_path / "pkg"),
                         "--config", str(config))
    line = one_error_line(err)
    assert status == 2 and "maxParallelTrials 17 is more than the local runner's limit of " \
                           "16 trials at once" in line
    nothing_written(tmp_path / "job")


@pytest.mark.parametrize("earlier", ["missing", "not tuning", "no study"])
def test_resume_previous_job_is_checked_before_anything_is_written(capsys, tmp_path,
                                                                   earlier):
    """Before: a missing or non-tuning job was refused after the package was staged, and
    the new job id was used up."""
    if earlier != "missing":
        record = records.JobRecord("old01", state=records.SUCCEEDED,
                                   job_dir=str(tmp_path / "old"))
        if earlier == "no study":
            record.training_input = {"hyperparameters": _hp()}
        records.save(record)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"trainingInput": {"hyperparameters": _hp(
        resumePreviousJobId="old01")}}))
    status, _, err = run(capsys, "tune02", "--job-dir", str(tmp_path / "job"),
                         "--package-path", write_package(tmp_path / "pkg"),
                         "--config", str(config))
    line = one_error_line(err)
    assert status == 2 and "resumePreviousJobId" in line
    assert {"missing": "no job 'old01' in the local index",
            "not tuning": "'old01' is not a hyperparameter tuning job",
            "no study": "'old01' has no study to continue"}[earlier] in line
    assert not os.path.exists(tmp_path / "job")
    assert not os.path.exists(records.index_path("tune02"))
    assert not os.path.exists(os.path.join(os.environ["MLJOB_HOME"], "envs"))


# --- the job index ---------------------------------------------------------------------

DAMAGED = {
    "state null": ({"state": None}, ["jobs", "list"]),
    "state unknown": ({"state": "EXPLODED"}, ["jobs", "list", "--sort-by", "state"]),
    "start time a string": ({"start_time": "yesterday"}, ["jobs", "list", "--sort-by",
                                                          "startTime"]),
    "labels a list": ({"labels": ["team", "a"]}, ["jobs", "list", "--filter",
                                                  "labels.team=a"]),
    "trials not objects": ({"training_output": {"trials": [1, "x"]}}, ["jobs", "list"]),
}


def _index(name: str) -> str:
    folder = os.path.join(os.environ["MLJOB_HOME"], "jobs")
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, name)


def _good(job_id: str, **fields) -> dict:
    data = json.loads(records.JobRecord(job_id, state=records.SUCCEEDED,
                                        start_time=5.0, labels={"team": "a"}).to_json())
    data.update(fields)
    return data


@pytest.mark.parametrize("case", list(DAMAGED))
def test_a_damaged_record_is_named_and_skipped_and_the_rest_stay_usable(capsys, caplog,
                                                                       case):
    """Before: one record with a null state (a string start time under --sort-by, labels
    that are a list under --filter) crashed `jobs list` for every job; trials that are
    not objects crashed `jobs describe`."""
    fields, argv = DAMAGED[case]
    records.save(records.JobRecord("good01", state=records.SUCCEEDED, start_time=5.0,
                                   labels={"team": "a"}))
    with open(_index("bad01.json"), "w") as f:
        json.dump(_good("bad01", **fields), f)
    with caplog.at_level(logging.WARNING):
        status, out, err = run(capsys, *argv)
    assert status == 0 and "Traceback" not in err, err
    assert "good01" in out and "bad01" not in out
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and warned[0].startswith(
        f"skipping the damaged job record {_index('bad01.json')} (its ")
    status, _, err = run(capsys, "jobs", "describe", "bad01")
    assert status == 1 and f"record {_index('bad01.json')} is damaged" in one_error_line(err)
    status, out, _ = run(capsys, "jobs", "describe", "good01")
    assert status == 0 and "good01" in out


@pytest.mark.timeout(60)
def test_a_named_pipe_in_the_index_is_never_opened_and_the_warning_is_one_line(tmp_path):
    """Before: every *.json was opened, and a named pipe blocked `jobs list` for ever. Run
    as a user would, so the warning's one line on stderr is what is checked."""
    records.save(records.JobRecord("good01", state=records.SUCCEEDED))
    os.mkfifo(_index("pipe01.json"))
    os.mkfifo(_index("pipe02.json"))
    proc = subprocess.run([sys.executable, "-m", "submit", "jobs", "list"],
                          capture_output=True, text=True, timeout=50,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                              os.path.abspath(__file__)))))
    assert proc.returncode == 0 and "good01" in proc.stdout, proc.stderr
    assert proc.stderr.splitlines() == [
        f"warning: skipping the damaged job record {_index(n)} (it is not a regular "
        "file); remove it" for n in ("pipe01.json", "pipe02.json")]
    status = subprocess.run([sys.executable, "-m", "submit", "jobs", "describe", "pipe01"],
                            capture_output=True, text=True, timeout=50)
    assert status.returncode == 1 and "is not a regular file" in status.stderr


# --- archives: bounded before anything is read whole ---------------------------------

def test_an_sdist_member_that_expands_far_is_read_a_line_at_a_time(tmp_path):
    """Before: a 0.2 MB sdist whose one .py member expands to 200 MB was read whole to
    look for `import mljob` (the peak reached 440 MB). Measured in a child."""
    import tarfile
    path = tmp_path / "bomb-1.0.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, size in (("bomb-1.0/setup.py", 10), ("bomb-1.0/big.py", 200 << 20)):
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, _Zeros(size))
    assert os.path.getsize(path) < 1 << 20
    result = run_measured(f"""
        from submit.packaging import package
        pkg = package.describe({str(path)!r})
        print("IMPORTS", package.imports_mljob(pkg))
    """, limit_mb=1536)
    assert result["error"] is None and "IMPORTS False" in result["stdout"], result
    assert result["peak_mb"] < 120, result


def test_a_wheel_is_bounded_and_streamed_like_an_sdist(tmp_path, monkeypatch):
    """Before: wheels had no member-count or size bound, and each member was read whole."""
    import zipfile
    from submit.packaging import archives, package
    from submit.errors import PackageUsageError
    wheel = tmp_path / "bomb-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("bomb/big.py", "w") as f:
            for _ in range(200):
                f.write(bytes(1 << 20))
        z.writestr("bomb/__init__.py", "import mljob.hypertune\n")
    assert os.path.getsize(wheel) < 1 << 20
    result = run_measured(f"""
        from submit.packaging import package
        pkg = package.describe({str(wheel)!r})
        print("IMPORTS", package.imports_mljob(pkg))
    """, limit_mb=1536)
    assert result["error"] is None and "IMPORTS True" in result["stdout"], result
    assert result["peak_mb"] < 120, result
    monkeypatch.setattr(archives, "MAX_EXTRACTED_BYTES", 100 << 20)
    with pytest.raises(PackageUsageError, match="expands to more than 100000 members or "
                                                "104857600 bytes"):
        package.describe(str(wheel))
    monkeypatch.setattr(archives, "MAX_EXTRACTED_BYTES", 1 << 30)
    monkeypatch.setattr(archives, "MAX_MEMBERS", 1)
    for action in (lambda: package.describe(str(wheel)),
                   lambda: package.check_members(str(wheel))):
        with pytest.raises(PackageUsageError, match="more than 1 members"):
            action()


class _Zeros:
    """A file of `size` zero bytes, read in pieces (tarfile copies from it)."""

    def __init__(self, size: int):
        self.left = size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return bytes(n)


def test_the_dry_runs_help_says_it_runs_setup_py(capsys):
    """A dry run must build the sdist to show the package's URL and hash: its help says
    so, and how to run no setup.py at all."""
    _, out, err = run(capsys, "submit", "--help")
    text = " ".join((out + err).split())
    assert "it builds the sdist (runs your setup.py sdist in a temporary copy)" in text
    assert "give built archives (--packages, or packageUris in --config) to run none" in text
