"""`jobs submit prediction` refuses every bad flag in one line, exit status 2, before
anything is recorded or written (no TensorFlow needed: the export is only looked at)."""
import json
import os

import pytest

from tests.support.submit_cli import one_error_line, run


@pytest.fixture
def setup(tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    (export / "saved_model.pb").write_bytes(b"")
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.json").write_text('{"image": [0.5], "key": 1}\n')
    return tmp_path


def base(tmp, **change):
    flags = {"--model-dir": str(tmp / "export"), "--input-paths": str(tmp / "in" / "*.json"),
             "--output-path": str(tmp / "out"), "--data-format": "text",
             "--region": "us-central1"}
    flags.update(change)
    argv = ["jobs", "submit", "prediction", change.pop("job", "j"), "--dry-run"]
    for flag, value in flags.items():
        if flag != "job" and value is not None:
            argv += [flag, value]
    return argv


CASES = [  # (flags changed, words the one-line error holds)
    ({"--model-dir": None}, "exactly one of --model-dir"),
    ({"--model": "m"}, "exactly one of --model-dir"),
    ({"--version": "v1"}, "--version goes with --model"),
    ({"--model-dir": None, "--model": "nosuch"}, "no model 'nosuch' in the local index"),
    ({"--model-dir": None, "--model": "projects/p/locations/r/models/1"},
     "Vertex resource name"),
    ({"--model-dir": None, "--model": "bad name"}, "not a model or version name"),
    ({"--model-dir": "SELF/nothing-here"}, "holds no export"),
    ({"--model-dir": "ftp://host/model"}, "unknown URL scheme"),
    ({"--input-paths": None}, "--input-paths is required"),
    ({"--input-paths": " , "}, "names no file"),
    ({"--input-paths": "SELF/in/*.nothing"}, "no input file matched"),
    ({"--input-paths": "SELF/in/a\n.json"}, "control character"),
    ({"--input-paths": "s3://bucket/x"}, "unknown URL scheme"),
    ({"--input-paths": "memory://in/*.json"}, "memory:// store lives in one process"),
    ({"--output-path": "memory://out"}, "memory:// store lives in one process"),
    ({"--output-path": None}, "--output-path is required"),
    ({"--output-path": "SELF/in/a.json"}, "is a file"),
    ({"--output-path": "SELF/theirs"}, "holds the output of job 'other'"),
    ({"--output-path": "SELF/loose"}, "of no job of ours"),
    ({"--data-format": None}, "--data-format is required"),
    ({"--data-format": "json"}, "Invalid value for '--data-format'"),
    ({"--region": None}, "--region is required"),
    ({"--region": "moon"}, "is not a region"),
    ({"--max-worker-count": "0"}, "--max-worker-count 0 is out of range"),
    ({"--max-worker-count": "1001"}, "--max-worker-count 1001 is out of range"),
    ({"--max-worker-count": "many"}, "'many' is not a valid integer"),
    ({"--batch-size": "0"}, "--batch-size 0 is out of range"),
    ({"--batch-size": "100000"}, "--batch-size 100000 is out of range"),
    ({"--signature-name": " "}, "--signature-name is empty"),
    ({"--signature-name": "a\x1bb"}, "control character"),
    ({"--labels": "Team=x"}, "label key 'Team'"),
    ({"--labels": "novalue"}, "--labels"),
    ({"--runtime-version": "latest"}, "not a runtime version"),
    ({"job": "1job"}, "invalid job id"),
    ({"--project": "p"}, "--project is for --runner vertex"),
    ({"--namespace": "n"}, "--namespace is for --runner kubeflow"),
    ({"--kube-context": "c"}, "--kube-context is for --runner kubeflow"),
    # training options of the same runners are no batch prediction job's flags
    ({"--queue": "q"}, "No such option '--queue'"),
    ({"--service-account": "a@b"}, "No such option '--service-account'"),
    ({"--runner": "cloud"}, "Invalid value for '--runner'"),
    ({"--runner": "ray"}, "--runner ray does not run batch prediction jobs; use --runner "
                          "local or vertex or kubeflow"),
]


@pytest.mark.parametrize("change,words", CASES, ids=[w[:30] for _, w in CASES])
def test_bad_flag_one_line_nothing_written(setup, capsys, change, words):
    tmp = setup
    (tmp / "theirs").mkdir()
    (tmp / "theirs" / ".mljob-job.json").write_text(json.dumps({"jobId": "other"}))
    (tmp / "theirs" / "prediction.results-00000-of-00001").write_text("")
    (tmp / "loose").mkdir()
    (tmp / "loose" / "prediction.results-00000-of-00001").write_text("")
    change = {k: v.replace("SELF", str(tmp)) if isinstance(v, str) else v
              for k, v in change.items()}
    status, _, err = run(capsys, *base(tmp, **change))
    assert status == 2
    assert words in one_error_line(err)
    assert not os.path.exists(tmp / "out")
    assert not os.path.exists(os.path.join(os.environ["MLJOB_HOME"], "jobs"))


def test_split_bytes_variable_is_checked(setup, capsys, monkeypatch):
    monkeypatch.setenv("MLJOB_PREDICTION_SPLIT_BYTES", "lots")
    status, _, err = run(capsys, *base(setup))
    assert status == 2 and "MLJOB_PREDICTION_SPLIT_BYTES" in one_error_line(err)


def test_model_versions_resolve_to_the_default_or_the_one_named(setup, capsys):
    from submit import models
    base = models.create_model("mnist", None, None, {}, [])
    for v in ("1", "3", "12"):  # published without a name: listed as v1, v3, v12
        os.makedirs(os.path.join(base, v))
        open(os.path.join(base, v, "saved_model.pb"), "wb").close()
    status, out, err = run(capsys, *base_flags(setup, model="mnist"))
    assert status == 0, err  # no default version: the highest published
    assert json.loads(out)["model_dir"] == os.path.join(base, "12")
    status, out, _ = run(capsys, *base_flags(setup, model="mnist", version="v3"))
    assert json.loads(out)["model_dir"] == os.path.join(base, "3")
    models.set_default("mnist", "v1")
    status, out, _ = run(capsys, *base_flags(setup, model="mnist"))
    assert json.loads(out)["model_dir"] == os.path.join(base, "1")
    status, _, err = run(capsys, *base_flags(setup, model="mnist", version="v2"))
    assert status == 2 and "has no version 'v2'" in one_error_line(err)
    status, _, err = run(capsys, *base_flags(setup, model="nosuch"))
    assert status == 2 and "no model 'nosuch' in the local index" in one_error_line(err)


def base_flags(setup, model, version=None):
    extra = {"--model-dir": None, "--model": model}
    if version:
        extra["--version"] = version
    return base(setup, **extra)


def test_used_job_id_refused_and_resume_only_to_the_same_output(setup, capsys):
    from submit import jobs
    jobs.save(jobs.JobRecord("j", state=jobs.FAILED,
                             prediction_input={"outputPath": str(setup / "first")}))
    for extra in ([], ["--resume"]):
        status, _, err = run(capsys, *base(setup), *extra)
        line = one_error_line(err)
        assert status == 2 and "job id 'j' already exists (FAILED)" in line
        assert f"--resume with --output-path {setup / 'first'}" in line
