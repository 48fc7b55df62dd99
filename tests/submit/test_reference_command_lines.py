"""Every command line of tests/submit/reference_command_lines.txt (copied from gcloud's
and TF Serving's reference pages, names changed) is taken as it is written: each gcloud
line is parsed by `python -m submit`'s own parser, and those that run in a moment here
(models, versions, jobs list/describe/stream-logs/update/cancel) are run for real on an
empty home: they succeed or answer in one line, never "No such option". Each TF Serving
line is parsed by `tensorflow_model_server`'s flags."""
from __future__ import annotations

import os
import re
import shlex

import click
import pytest
import yaml

from predict.serving import flags as serving_flags
from submit.cli import cli_base
from tests.support.submit_cli import run

LINES = os.path.join(os.path.dirname(__file__), "reference_command_lines.txt")
# what a run here cannot do in a moment (a build, TensorFlow, a server): parsed only
PARSED_ONLY = (("jobs", "submit"), ("local", "predict"), ("predict",))


def commands() -> list[str]:
    """The file's commands, continuation lines joined."""
    out, current = [], ""
    with open(LINES, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not current and (not line.strip() or line.startswith("#")):
                continue
            if line.endswith("\\"):
                current += line[:-1] + " "
                continue
            out.append(current + line)
            current = ""
    assert not current, "a block ends in \\"
    return out


def words(command: str, values: dict[str, str]) -> list[str]:
    text = re.sub(r"\$\{?([A-Z_]+)\}?", lambda m: values[m[1]], command)
    return shlex.split(text)


@pytest.fixture
def values(tmp_path) -> dict[str, str]:
    export = tmp_path / "export"
    export.mkdir()
    (export / "saved_model.pb").write_bytes(b"not read by a publish")
    config = tmp_path / "version.yaml"
    config.write_text(yaml.safe_dump({
        "deploymentUri": str(export), "runtimeVersion": "2.11", "framework": "TENSORFLOW",
        "machineType": "mls1-c1-m2", "autoScaling": {"minNodes": 1}}))
    for name in ("models.config", "batching.config", "monitoring.config", "in.json"):
        (tmp_path / name).write_text("")
    return {"MODEL_NAME": "census", "VERSION_NAME": "v1", "REGION": "us-central1",
            "MODEL_DIR": str(export), "MACHINE_TYPE": "n1-standard-2",
            "CONFIG_FILE": str(config), "INPUT_DATA_FILE": str(tmp_path / "in.json"),
            "INPUT_FILE": str(tmp_path / "in.json"), "JOB_NAME": "census_job_1",
            "JOB_DIR": str(tmp_path / "jobdir"), "ETAG": "QUJDRA==",
            "INPUT_PATHS": str(tmp_path / "in.json"), "OUTPUT_PATH": str(tmp_path / "out"),
            "MODEL_BASE_PATH": "/models", "MODELS_CONFIG": str(tmp_path / "models.config"),
            "MODEL_BASE": str(tmp_path / "base"),
            "BATCHING_CONFIG": str(tmp_path / "batching.config"),
            "MONITORING_CONFIG": str(tmp_path / "monitoring.config")}


def parse_only(argv: list[str], monkeypatch) -> None:
    """argv through the CLI's parsers with every command's body replaced: what is
    refused here is refused by parsing. `local predict`'s own flags are `predict
    local`'s, parsed by it too."""
    from predict import __main__ as predict_cli
    from submit.cli import cmd_local

    def parsed(*_, **__):
        ctx = click.get_current_context()
        if ctx.command.name == "predict" and ctx.parent and ctx.parent.command.name == \
                "local":
            predict_cli.local.make_context("local", cmd_local.without_framework(
                list(ctx.args)))
        return 0

    def leaves(group):
        for command in group.commands.values():
            if isinstance(command, click.Group):
                yield from leaves(command)
            else:
                yield command
    for command in leaves(cli_base.cli):
        monkeypatch.setattr(command, "callback", parsed)


def test_every_reference_line_is_taken(capsys, monkeypatch, values):
    seen = {"gcloud": 0, "tensorflow_model_server": 0}
    for command in commands():
        argv = words(command, values)
        seen[argv[0]] += 1
        if argv[0] == "tensorflow_model_server":
            serving_flags.parse(argv[1:], environ={})  # raises on a flag it refuses
            continue
        assert argv[:2] == ["gcloud", "ai-platform"], command
        argv = argv[2:]
        if tuple(argv[:2]) in PARSED_ONLY or tuple(argv[:1]) in PARSED_ONLY:
            with monkeypatch.context() as patch:
                parse_only(argv, patch)
                status, out, err = run(capsys, *argv)
            assert status == 0, (command, err)
            continue
        status, out, err = run(capsys, *argv)
        assert "no such option" not in err.lower(), (command, err)
        if status != 0:  # the one line that says the job does not exist here
            errors = [line for line in err.splitlines() if line.startswith("error: ")]
            assert len(errors) == 1 and "Traceback" not in err, (command, err)
            assert values["JOB_NAME"] in errors[0], (command, err)
    assert seen["gcloud"] >= 20 and seen["tensorflow_model_server"] >= 8

    # what the lines asked for is in the resources
    status, out, _ = run(capsys, "models", "describe", "census_logged", "--format", "json")
    model = yaml.safe_load(out)
    assert model["onlinePredictionLogging"] is True
    assert model["onlinePredictionConsoleLogging"] is True
    assert model["labels"] == {"team": "census", "stage": "dev"}
    status, out, _ = run(capsys, "models", "describe", "census", "--format", "json")
    assert yaml.safe_load(out)["regions"] == ["us-central1"]
    status, out, _ = run(capsys, "versions", "list", "--model", "census", "--format", "json")
    found = {v["name"]: v for v in yaml.safe_load(out)}
    assert (found["v1"]["runtimeVersion"], found["v1"]["pythonVersion"],
            found["v1"]["machineType"]) == ("2.11", "3.7", "n1-standard-2")
    assert found["census_v2"]["machineType"] == "mls1-c1-m2"  # from --config
    assert found["census_v2"]["autoScaling"] == {"minNodes": 1}
    assert found["census_v3"]["description"] == "census v2"


@pytest.mark.parametrize("argv, words_", [
    (["models", "create", "m1", "--enable-loging"], "No such option"),  # gcloud never had it
    (["versions", "create", "v1", "--model", "m1", "--framework", "xgboost", "--origin",
      "x"], "not XGBoost boosters"),
    (["versions", "create", "v1", "--model", "m1", "--runtime-version", "latest",
      "--origin", "x"], "--runtime-version 'latest' is not a version"),
    (["versions", "create", "v1", "--model", "m1"], "give the export to publish: --origin"),
    (["models", "create", "m1", "--region", "europe"], "not a Google Cloud region"),
    (["jobs", "stream-logs", "j1", "--polling-interval", "0"], "--polling-interval"),
    (["local", "predict", "--model-dir", "x", "--framework", "scikit-learn",
      "--json-instances", "f"], "not scikit-learn pickles"),
])
def test_flags_gcloud_never_had_and_values_this_cannot_serve_are_one_line(
        capsys, argv, words_):
    status, out, err = run(capsys, *argv)
    assert status == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and words_ in lines[0], err


def test_a_version_config_field_for_code_this_server_does_not_run_is_refused(
        capsys, tmp_path):
    config = tmp_path / "v.yaml"
    config.write_text("deploymentUri: x\npredictionClass: my.Predictor\n")
    run(capsys, "models", "create", "m1")
    status, _, err = run(capsys, "versions", "create", "v1", "--model", "m1", "--config",
                         str(config))
    assert status == 2 and "predictionClass: custom prediction routines" in err
    config.write_text("deploymentUri: x\nautoScalling: {}\n")
    status, _, err = run(capsys, "versions", "create", "v1", "--model", "m1", "--config",
                         str(config))
    assert status == 2 and "unknown Version field 'autoScalling'" in err
