"""gcloud's flags for the user's own packages, refused in one line before anything is
staged: --packages that are not archives or not there, and malformed --region,
--runtime-version and --python-version (in flags and in config.yaml)."""
from __future__ import annotations

import pytest

from tests.support.submit_cli import files_under, run


@pytest.mark.parametrize("extra,message", [
    (["--packages", "dep.zip"], "--packages 'dep.zip' is not an sdist or a wheel"),
    (["--packages", "missing-1.0.tar.gz"], "--packages"),
    (["--region", "us central1"], "--region 'us central1' is not a Google Cloud region"),
    (["--region", "us-central1\n"], "--region"),
    (["--runtime-version", "latest"], "--runtime-version 'latest' is not a runtime version"),
    (["--runtime-version", "２.１"], "is not a runtime version"),
    (["--python-version", "three"], "--python-version 'three' is not a Python version"),
], ids=["not an archive", "missing archive", "region with a space", "region with a newline",
        "runtime latest", "full-width digits", "python words"])
def test_bad_package_and_version_flags_exit_2_and_stage_nothing(capsys, tmp_path, pkg, extra,
                                                                message):
    job_dir = tmp_path / "job"
    status, out, err = run(capsys, "job01", "--package-path", pkg, "--job-dir", str(job_dir),
                           *extra)
    assert status == 2 and out == "", err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert files_under(job_dir) == []


def test_a_bad_python_version_in_the_config_names_the_config_key(capsys, tmp_path, pkg):
    config = tmp_path / "config.yaml"
    config.write_text("trainingInput:\n  pythonVersion: '3.x'\n")
    status, _, err = run(capsys, "job01", "--package-path", pkg, "--job-dir",
                         str(tmp_path / "job"), "--config", str(config))
    assert status == 2
    assert "trainingInput.pythonVersion '3.x' is not a Python version" in err, err
