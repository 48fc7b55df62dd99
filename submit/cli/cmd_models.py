"""`models create|list|describe|delete` and `versions create|list|describe|delete|
set-default`, as `gcloud ai-platform models` and `versions` (see `submit.models`)."""
from __future__ import annotations

import functools

import click

from submit.cli import formats
from submit import models
from submit.jobdef import spec as specs, version_config
from submit.cli.cli_base import GcloudGroup, cli, echo
from submit.errors import EXIT_OK

MODEL_KEYS = [("name", "NAME"), ("defaultVersion.name", "DEFAULT_VERSION_NAME")]
VERSION_KEYS = [("name", "NAME"), ("deploymentUri", "DEPLOYMENT_URI"), ("state", "STATE")]
MODEL_OPTION = click.option("--model", required=True, help="The model's name.")
REGION_OPTION = click.option("--region", metavar="REGION",
                             help="gcloud's regional endpoint, e.g. us-central1: checked "
                                  "and said to change nothing here (models are served "
                                  "where `predict serve` runs).")


def regional(command):
    """gcloud's --region on a command that reads or changes what is here: checked, and
    one line on stderr says it changes nothing."""
    @functools.wraps(command)
    def run(*args, region=None, **kwargs):
        version_config.check_region(region)
        version_config.region_note(region, echo)
        return command(*args, **kwargs)
    return REGION_OPTION(run)


def _labels(values) -> dict[str, str]:
    return specs.parse_labels_flag(values) if values else {}


@cli.group("models", cls=GcloudGroup)
def models_group():
    """Models: base paths that `predict serve --model-base-path` serves."""


@models_group.command("create")
@click.argument("model")
@click.option("--base-path", metavar="URL",
              help="Where its versions go: any path or URL [default: "
                   "$MLJOB_HOME/serving/MODEL].")
@click.option("--description", help="The model's description.")
@click.option("--labels", multiple=True, metavar="KEY=VALUE,...", help="Its labels.")
@click.option("--regions", metavar="REGION,...",
              help="Recorded as Cloud ML's regions (the model is served where `predict "
                   "serve` runs).")
@click.option("--region", metavar="REGION",
              help="gcloud's regional endpoint: recorded as the model's region when "
                   "--regions is not given.")
@click.option("--enable-logging", is_flag=True,
              help="Recorded as Cloud ML's onlinePredictionLogging (a model config "
                   "file's logging_config logs requests here).")
@click.option("--enable-console-logging", is_flag=True,
              help="Recorded as onlinePredictionConsoleLogging (the server logs to its "
                   "stderr).")
def models_create(model, base_path, description, labels, regions, region,
                  enable_logging, enable_console_logging):
    """Create a model (a base path, and its record there)."""
    wanted = [r for r in (regions or "").split(",") if r]
    for each in wanted:
        version_config.check_region(each, "--regions")
    version_config.check_region(region)
    if region and not wanted:
        wanted = [region]
    logging = {k: True for k, on in (("onlinePredictionLogging", enable_logging),
                                     ("onlinePredictionConsoleLogging",
                                      enable_console_logging)) if on}
    base = models.create_model(model, base_path, description, _labels(labels), wanted,
                               logging)
    if logging:
        echo(f"{' and '.join(logging)} recorded in the Model; `predict serve` logs "
             "requests by its model config's logging_config and to its stderr", err=True)
    echo(f"Created model [{model}] at {base}.")
    return EXIT_OK


@models_group.command("list")
@regional
@formats.FORMAT_OPTION
def models_list(fmt):
    """Models in the local index."""
    found = []
    for name in models.names():
        base, data = models.record(name)
        found.append(models.model_resource(name, base, data))
    formats.emit(echo, found, fmt or "table", single=False, default_keys=MODEL_KEYS)
    return EXIT_OK


@models_group.command("describe")
@regional
@click.argument("model")
@formats.FORMAT_OPTION
def models_describe(model, fmt):
    """The model as Cloud ML's Model resource (YAML unless --format says otherwise)."""
    base, data = models.record(model)
    formats.emit(echo, [models.model_resource(model, base, data)], fmt or "yaml",
                 single=True)
    return EXIT_OK


@models_group.command("delete")
@regional
@click.argument("model")
def models_delete(model):
    """Delete a model that has no versions left."""
    models.delete_model(model)
    echo(f"Deleted model [{model}].")
    return EXIT_OK


@cli.group("versions", cls=GcloudGroup)
def versions_group():
    """A model's versions: numbered exports its server serves, named as gcloud names
    them; the default one answers requests that name no version."""


@versions_group.command("create")
@click.argument("version")
@MODEL_OPTION
@click.option("--origin", metavar="URL",
              help="The export to publish: <job-dir>/model. Any path or URL [default: "
                   "--config's deploymentUri].")
@click.option("--description", help="The version's description.")
@click.option("--labels", multiple=True, metavar="KEY=VALUE,...", help="Its labels.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="A YAML or JSON Version resource (deploymentUri, runtimeVersion, "
                   "framework, machineType, autoScaling, ...); flags win over it.")
@click.option("--framework", help="tensorflow (scikit-learn and xgboost are refused: "
                                  "this server loads SavedModels).")
@click.option("--runtime-version", help="Cloud ML's runtime version, recorded.")
@click.option("--python-version", help="Cloud ML's Python version, recorded.")
@click.option("--machine-type", help="Cloud ML's prediction machine, e.g. mls1-c1-m2, "
                                     "recorded.")
@REGION_OPTION
def versions_create(version, model, origin, description, labels, config_path, framework,
                    runtime_version, python_version, machine_type, region):
    """Publish an export as a new version (every file, then the marker last); the first
    version becomes the default."""
    version_config.check_region(region)
    fields = version_config.version_fields(
        config_path=config_path, origin=origin, description=description,
        labels=_labels(labels), runtime_version=runtime_version,
        python_version=python_version, machine_type=machine_type,
        framework_text=framework)
    version_config.region_note(region, echo)
    made = models.create_version(model, version, fields["origin"], fields["description"],
                                 fields["labels"], fields["settings"])
    version_config.note_settings(fields["settings"], echo)
    echo(f"Created version [{version}] of model [{model}] as version {made['number']}.")
    return EXIT_OK


@versions_group.command("list")
@regional
@MODEL_OPTION
@formats.FORMAT_OPTION
def versions_list(model, fmt):
    """The model's versions, oldest first."""
    base, data = models.record(model)
    found = sorted(models.versions(base, data).items(), key=lambda kv: kv[1]["number"])
    formats.emit(echo, [models.version_resource(model, base, data, n, v)
                        for n, v in found], fmt or "table", single=False,
                 default_keys=VERSION_KEYS)
    return EXIT_OK


@versions_group.command("describe")
@regional
@click.argument("version")
@MODEL_OPTION
@formats.FORMAT_OPTION
def versions_describe(version, model, fmt):
    """The version as Cloud ML's Version resource."""
    base, data = models.record(model)
    found = models.find_version(base, data, version, model)
    formats.emit(echo, [models.version_resource(model, base, data, version, found)],
                 fmt or "yaml", single=True)
    return EXIT_OK


@versions_group.command("delete")
@regional
@click.argument("version")
@MODEL_OPTION
def versions_delete(version, model):
    """Delete a version (unpublished first, so a server never loads half of it)."""
    models.delete_version(model, version)
    echo(f"Deleted version [{version}] of model [{model}].")
    return EXIT_OK


@versions_group.command("set-default")
@regional
@click.argument("version")
@MODEL_OPTION
def versions_set_default(version, model):
    """Make a version the default: a running server moves its `default` label at its next
    poll of the base path, without a restart."""
    models.set_default(model, version)
    echo(f"Version [{version}] is model [{model}]'s default.")
    return EXIT_OK
