"""`models create|list|describe|delete` and `versions create|list|describe|delete|
set-default`, as `gcloud ai-platform models` and `versions` (see `submit.models`)."""
from __future__ import annotations

import click

from submit import formats, models, spec as specs
from submit.cli_base import GcloudGroup, cli, echo
from submit.errors import EXIT_OK

MODEL_KEYS = [("name", "NAME"), ("defaultVersion.name", "DEFAULT_VERSION_NAME")]
VERSION_KEYS = [("name", "NAME"), ("deploymentUri", "DEPLOYMENT_URI"), ("state", "STATE")]
MODEL_OPTION = click.option("--model", required=True, help="The model's name.")


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
def models_create(model, base_path, description, labels, regions):
    """Create a model (a base path, and its record there)."""
    wanted = [r for r in (regions or "").split(",") if r]
    for region in wanted:
        if not specs.VERSIONS["region"].fullmatch(region):
            raise click.UsageError(f"--regions {region!r:.40} is not a Google Cloud "
                                   "region; write e.g. us-central1")
    base = models.create_model(model, base_path, description, _labels(labels), wanted)
    echo(f"Created model [{model}] at {base}.")
    return EXIT_OK


@models_group.command("list")
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
@click.argument("model")
@formats.FORMAT_OPTION
def models_describe(model, fmt):
    """The model as Cloud ML's Model resource (YAML unless --format says otherwise)."""
    base, data = models.record(model)
    formats.emit(echo, [models.model_resource(model, base, data)], fmt or "yaml",
                 single=True)
    return EXIT_OK


@models_group.command("delete")
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
@click.option("--origin", required=True, metavar="URL",
              help="The export to publish: <job-dir>/model. Any path or URL.")
@click.option("--description", help="The version's description.")
@click.option("--labels", multiple=True, metavar="KEY=VALUE,...", help="Its labels.")
def versions_create(version, model, origin, description, labels):
    """Publish an export as a new version (every file, then the marker last); the first
    version becomes the default."""
    made = models.create_version(model, version, origin, description, _labels(labels))
    echo(f"Created version [{version}] of model [{model}] as version {made['number']}.")
    return EXIT_OK


@versions_group.command("list")
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
@click.argument("version")
@MODEL_OPTION
def versions_delete(version, model):
    """Delete a version (unpublished first, so a server never loads half of it)."""
    models.delete_version(model, version)
    echo(f"Deleted version [{version}] of model [{model}].")
    return EXIT_OK


@versions_group.command("set-default")
@click.argument("version")
@MODEL_OPTION
def versions_set_default(version, model):
    """Make a version the default: a running server moves its `default` label at its next
    poll of the base path, without a restart."""
    models.set_default(model, version)
    echo(f"Version [{version}] is model [{model}]'s default.")
    return EXIT_OK
