"""python -m predict local|batch|serve: predictions from an export.

This is the one layer that turns the predictor's typed errors into a one-line
`error: ...` on stderr and an exit status (2 for the user's mistakes).
"""
from __future__ import annotations

import os
import sys

# Quiet TensorFlow's C++ start-up chatter before anything imports it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import click

from predict.errors import PredictError
from mljob.storage import StorageError

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
    from predict import instances, local as local_mode, model as models
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
    from predict import batch as batch_mode, model as models
    files = batch_mode.expand_inputs(input_paths)
    model = models.load(model_dir)
    summary = batch_mode.run(model, files, data_format, output_path,
                             batch_size=batch_size, signature_name=signature_name)
    click.echo(summary.line())
    if summary.instances and not summary.predicted:
        raise PredictError("no instance could be predicted; see "
                           f"{output_path}/prediction.errors_stats-*")


@cli.command()
@click.option("--model-dir", metavar="URL",
              help="One export, served as version 1 (not watched).")
@click.option("--model-base-path", "--model_base_path", "base_path", metavar="URL",
              help="A folder of numbered version folders (BASE/1, BASE/2, ...), watched "
                   "for new versions. Any fsspec URL.")
@click.option("--model-config-file", "--model_config_file", "config_file", metavar="URL",
              help="Several models: TF Serving's model config (text proto, or the same "
                   "fields as .yaml/.json).")
@click.option("--model-name", "--model_name", default=None,
              help='Name in the URLs; default "default".')
@click.option("--model-version-policy", "version_policy", default="latest:1",
              show_default=True, metavar="POLICY",
              help="Versions served from --model-base-path: latest:N, all, or "
                   "specific:V1,V2.")
@click.option("--version-label", "version_labels", multiple=True, metavar="LABEL=VERSION",
              help="A version label for --model-base-path (repeatable), e.g. stable=3.")
@click.option("--file-system-poll-wait-seconds", "--file_system_poll_wait_seconds",
              "poll_seconds", type=click.FloatRange(0), default=1.0, show_default=True,
              help="How often base paths are listed for new versions; 0 loads once.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", "--rest_api_port", type=click.IntRange(0, 65535), default=8501,
              show_default=True, help="REST port.")
@click.option("--grpc-port", "--grpc_port", type=click.IntRange(0, 65535), default=None,
              help="Also serve TF Serving's gRPC API on this port (TF Serving's is 8500).")
@click.option("--max-body-bytes", type=click.IntRange(1), default=1572864,
              show_default=True)
@click.option("--max-instances", type=click.IntRange(1), default=100, show_default=True,
              help="Most instances one request may hold.")
@click.option("--threads", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Requests decoded and predicted at once.")
@click.option("--enable-batching", "--enable_batching", "batching", is_flag=True,
              help="Merge concurrent requests into one signature call.")
@click.option("--max-batch-size", type=click.IntRange(1, 4096), default=64,
              show_default=True, help="With --enable-batching: most instances a merged call.")
@click.option("--batch-timeout-micros", type=click.IntRange(0, 10_000_000), default=1000,
              show_default=True,
              help="With --enable-batching: how long a batch waits for more requests.")
def serve(model_dir, base_path, config_file, model_name, version_policy, version_labels,
          poll_seconds, host, port, grpc_port, max_body_bytes, max_instances, threads,
          batching, max_batch_size, batch_timeout_micros):
    """Serve TF Serving's REST API (v1), and its gRPC API with --grpc-port."""
    from predict import config as model_config, metrics, repository, server
    given = [flag for flag, value in (("--model-dir", model_dir),
                                      ("--model-base-path", base_path),
                                      ("--model-config-file", config_file)) if value]
    if len(given) != 1:
        raise click.UsageError("give exactly one of --model-dir, --model-base-path, "
                               "--model-config-file")
    if config_file and (model_name or version_labels):
        raise click.UsageError("--model-name and --version-label go with --model-dir or "
                               "--model-base-path; a config file names its own models")
    if model_dir and version_labels:
        raise click.UsageError("--version-label needs --model-base-path (--model-dir "
                               "serves one version)")
    if config_file:
        configs = model_config.read(config_file)
    elif base_path:
        configs = [repository.ModelConfig(
            name=model_name or "default", base_path=base_path,
            policy=repository.VersionPolicy.parse(version_policy),
            labels=model_config.parse_labels(version_labels))]
    else:
        configs = [repository.ModelConfig(name=model_name or "default", model_dir=model_dir)]
    registry = metrics.Metrics()
    batcher = None
    if batching:
        from predict import batching as batching_mode
        batcher = batching_mode.Batcher(max_batch_size=max_batch_size,
                                        timeout_s=batch_timeout_micros / 1e6,
                                        metrics=registry)
    repo = repository.Repository(configs, poll_seconds=poll_seconds,
                                 events=registry.model_event)
    server.serve(repo, host=host, port=port, max_body_bytes=max_body_bytes,
                 max_instances=max_instances, threads=threads, grpc_port=grpc_port,
                 metrics=registry, batcher=batcher)


@cli.command()
@click.option("--model-dir", required=True, metavar="URL",
              help="The export to publish: <job-dir>/model. Any fsspec URL.")
@click.option("--model-base-path", "--model_base_path", "base_path", required=True,
              metavar="URL", help="The base path a server watches (BASE/<version>/).")
@click.option("--version", type=click.IntRange(1), default=None,
              help="Version number; default: the highest there plus one.")
def publish(model_dir, base_path, version):
    """Publish an export as the next version under a served base path."""
    from predict import publish as publishing
    number = publishing.publish(model_dir, base_path, version)
    click.echo(f"published {model_dir} as version {number} at "
               f"{base_path.rstrip('/')}/{number}")


def main(argv=None) -> int:
    try:
        cli.main(args=argv, prog_name="python -m predict", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except (PredictError, StorageError) as exc:
        click.echo(f"error: {exc}", err=True)
        return getattr(exc, "exit_status", 1)
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
