"""python -m predict local|batch|serve: predictions from an export.

Its commands run inside the error boundary every mljob program shares
(`mljob.errors.boundary`), which turns the predictor's typed errors into a one-line
`error: ...` on stderr and an exit status (2 for the user's mistakes).
"""
from __future__ import annotations

import os
import sys

# Quiet TensorFlow's C++ start-up chatter before anything imports it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from mljob import startup
from mljob.errors import boundary, needs_extra

try:
    import click

    from predict.errors import PredictError
except ModuleNotFoundError as exc:  # installed without the `serve` extra
    needs_extra(exc, "python -m predict", "serve")

MODEL_DIR = click.option("--model-dir", required=True, metavar="URL",
                         help="The export: <job-dir>/model (SavedModel) or a folder "
                              "with export.meta (TF1). Any fsspec URL.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli():
    """Predictions from an mljob export, the way Cloud ML and TF Serving answer."""


@cli.command()
@MODEL_DIR
@click.option("--json-instances", metavar="FILE",
              help="One JSON instance a line; - reads stdin.")
@click.option("--json-request", metavar="FILE",
              help='One JSON document {"instances": [...]}; - reads stdin.')
@click.option("--text-instances", metavar="FILE",
              help="One instance a line, the value of the single input; - reads stdin.")
@click.option("--signature-name", default="serving_default", show_default=True)
@click.option("--format", "fmt", type=click.Choice(["json", "table"]), default="json",
              show_default=True)
def local(model_dir, json_instances, json_request, text_instances, signature_name, fmt):
    """Predict a few instances, like `gcloud ai-platform local predict`."""
    startup.tensorflow_quietly()  # its start-up notices off stderr: errors are one line
    from predict.runtime import instances
    from predict.offline import local as local_mode
    from predict.runtime import model as models
    given = [(flag, value) for flag, value in (("--json-instances", json_instances),
                                               ("--json-request", json_request),
                                               ("--text-instances", text_instances))
             if value is not None]
    if len(given) != 1:
        raise click.UsageError("give exactly one of --json-instances, --json-request, "
                               "--text-instances")
    flag, source = given[0]
    data = instances.read_source(source)
    model = models.load(model_dir)
    sig = model.signature(signature_name)
    if flag == "--json-instances":
        labelled = instances.json_instances(data)
    elif flag == "--json-request":
        labelled = instances.json_request(data)
    else:
        labelled = instances.text_instances(data, sig)
    rows = list(local_mode.predict_instances(model, labelled, sig.name))
    write = local_mode.write_table if fmt == "table" else local_mode.write_json
    write(rows, sys.stdout)


@cli.command()
@MODEL_DIR
@click.option("--input-paths", required=True, metavar="URL_GLOB",
              help="Input files: a glob or a comma-separated list of globs (any fsspec URL).")
@click.option("--data-format", required=True,
              type=click.Choice(["text", "tf-record", "tf-record-gzip"]),
              help="text: JSON lines; tf-record: TFRecord files of JSON instances or "
                   "tf.train.Example records; tf-record-gzip: the same, gzip-compressed.")
@click.option("--output-path", required=True, metavar="URL",
              help="Folder for prediction.results-* and prediction.errors_stats-* files.")
@click.option("--batch-size", type=click.IntRange(1, 256), default=64, show_default=True)
@click.option("--signature-name", default="serving_default", show_default=True)
def batch(model_dir, input_paths, data_format, output_path, batch_size, signature_name):
    """Predict many files, like Cloud ML batch prediction."""
    startup.tensorflow_quietly()
    from predict.offline import batch as batch_mode
    from predict.runtime import model as models
    files = batch_mode.expand_inputs(input_paths)
    model = models.load(model_dir)
    summary = batch_mode.run(model, files, data_format, output_path,
                             batch_size=batch_size, signature_name=signature_name)
    click.echo(summary.line())
    if summary.instances and not summary.predicted:
        raise PredictError("no instance could be predicted; see "
                           f"{output_path}/prediction.errors_stats-*")


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                               "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def serve(args):
    """Serve TF Serving's gRPC (--port, 8500) and REST (--rest_api_port) APIs, with
    `tensorflow_model_server`'s flags; --help lists them."""
    from predict.serving import process as serving  # TensorFlow: once the flags are checked
    return serving.main(list(args), prog="python -m predict serve")


@cli.command()
@click.option("--model-dir", required=True, metavar="PATH",
              help="The SavedModel folder (a local path), e.g. a served version's.")
@click.option("--output", metavar="URL", default=None,
              help="Where to write the file; default: model.tflite in --model-dir, "
                   "where --prefer_tflite_model reads it.")
def tflite(model_dir, output):
    """Convert an export to TensorFlow Lite for --prefer_tflite_model, checked first
    against the SavedModel's own answers."""
    from mljob import storage
    if not storage.is_local(model_dir):
        raise click.UsageError("--model-dir must be a local folder; copy the version "
                               "here first")
    startup.tensorflow_quietly()
    from predict.runtime import model as models, tflite as lite
    model = models.load(model_dir)
    if not isinstance(model, models.SavedModel):
        raise PredictError(f"{model_dir} is a TF1 export; only a SavedModel converts")
    content, names = lite.convert(model, storage.local_path(model_dir))
    target = output or storage.join(model_dir, lite.TFLITE_FILE)
    storage.write_bytes(target, content)
    click.echo(f"wrote {target} ({len(content)} bytes): signatures {', '.join(names)}, "
               f"answers within rtol={lite.RTOL:g} atol={lite.ATOL:g} of the SavedModel's")


@cli.command()
@click.option("--model-dir", required=True, metavar="URL",
              help="The export to publish: <job-dir>/model. Any fsspec URL.")
@click.option("--model-base-path", "--model_base_path", "base_path", required=True,
              metavar="URL", help="The base path a server watches (BASE/<version>/).")
@click.option("--version", type=click.IntRange(1), default=None,
              help="Version number; default: the highest there plus one.")
@click.option("--warmup-requests", metavar="FILE", default=None,
              help="TFRecord file of PredictionLog records, published as the version's "
                   "assets.extra/tf_serving_warmup_requests.")
def publish(model_dir, base_path, version, warmup_requests):
    """Publish an export as the next version under a served base path."""
    from predict.models import publish as publishing
    number = publishing.publish(model_dir, base_path, version,
                                warmup_requests=warmup_requests)
    click.echo(f"published {model_dir} as version {number} at "
               f"{base_path.rstrip('/')}/{number}")


def main(argv=None) -> int:
    return boundary(lambda: _cli(argv), program="python -m predict")


def _cli(argv) -> int:
    """click's own outcomes as statuses; everything else is the boundary's."""
    try:
        result = cli.main(args=argv, prog_name="python -m predict", standalone_mode=False)
    except click.exceptions.Abort:  # click's form of Ctrl-C
        raise KeyboardInterrupt from None
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    return result if isinstance(result, int) else 0  # serve's status


if __name__ == "__main__":
    sys.exit(main())
