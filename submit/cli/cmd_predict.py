"""`predict --model M [--version V] --json-instances F`: gcloud's online prediction, sent
to a running server (`python -m predict serve`, or TF Serving itself) over TF Serving's
REST API: `POST {endpoint}/v1/models/M[/versions/N | /labels/default]:predict`.

A version name is looked up in the model's record when the model is in the local index
(`v3` is version 3 otherwise); with no --version, a model whose record has a default
version is asked through the label `default` (Cloud ML's default version), else the
server's own choice (the highest version). The client knows nothing of the server's
flags: only the endpoint.
"""
from __future__ import annotations

import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request

import click

from submit.cli import formats
from submit import models
from submit.cli.cli_base import cli, echo
from submit.errors import EXIT_OK, SubmitError, UsageError

DEFAULT_ENDPOINT = "http://127.0.0.1:8501"   # `predict serve`'s and TF Serving's REST port
MAX_INSTANCES = 100                          # gcloud's limit for online prediction
MAX_INPUT_BYTES = 10 * 1024 * 1024
TIMEOUT_S = 300
_NUMBERED = re.compile(r"[vV]?([1-9][0-9]{0,17})")


def read_input(source: str, flag: str) -> str:
    """The file's text ('-': stdin), bounded, UTF-8."""
    if source == "-":
        data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
    else:
        from mljob import storage
        try:
            data = storage.read_bytes(source, limit=MAX_INPUT_BYTES)
        except FileNotFoundError:
            raise UsageError(f"{flag} {source} does not exist") from None
        except IsADirectoryError:
            raise UsageError(f"{flag} {source} is a folder; pass a file") from None
    if len(data) > MAX_INPUT_BYTES:
        raise UsageError(f"{flag} {source} is more than {MAX_INPUT_BYTES} bytes; online "
                         f"prediction takes at most {MAX_INSTANCES} instances (use batch "
                         "prediction for more)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{flag} {source} is not UTF-8 text (byte at offset "
                         f"{exc.start}); save it as UTF-8") from None


def instances_from(flag: str, text: str) -> list:
    if flag == "--json-request":
        try:
            request = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"--json-request is not JSON: {exc}") from None
        if not isinstance(request, dict) or not isinstance(request.get("instances"), list):
            raise UsageError('--json-request must be {"instances": [...]}')
        found = request["instances"]
    else:
        found = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            if flag == "--text-instances":
                found.append(line)
                continue
            try:
                found.append(json.loads(line))
            except ValueError as exc:
                raise UsageError(f"--json-instances line {n} is not JSON ({exc}); write "
                                 "one JSON instance a line") from None
    if not found:
        raise UsageError(f"{flag} holds no instances")
    if len(found) > MAX_INSTANCES:
        raise UsageError(f"{flag} holds {len(found)} instances; online prediction takes "
                         f"at most {MAX_INSTANCES} (use batch prediction for more)")
    return found


def model_path(model: str, version: str | None) -> str:
    """`/v1/models/M[/versions/N | /labels/default]`."""
    models.check_name(model, "model")
    known = model in models.names()
    if version is not None:
        if known:
            base, data = models.record(model)
            number = models.find_version(base, data, version, model)["number"]
        else:
            match = _NUMBERED.fullmatch(version)
            if not match:
                raise UsageError(f"--version {version!r:.40}: model {model!r} is not in "
                                 "the local index, so only numbered versions (3 or v3) "
                                 "can be named")
            number = int(match[1])
        return f"/v1/models/{model}/versions/{number}"
    if known:
        _, data = models.record(model)
        if data.get("defaultVersion"):
            return f"/v1/models/{model}/labels/default"
    return f"/v1/models/{model}"


@cli.command("predict")
@click.option("--model", required=True, help="The served model's name.")
@click.option("--version", help="A version name (v3, or the name `versions create` gave) "
                                "[default: the model's default version].")
@click.option("--json-instances", metavar="FILE", help="One JSON instance a line; - "
                                                      "reads stdin.")
@click.option("--json-request", metavar="FILE", help='{"instances": [...]}; - reads stdin.')
@click.option("--text-instances", metavar="FILE", help="One instance a line, as text.")
@click.option("--signature-name", help="The signature to call [default: the server's, "
                                       "serving_default].")
@click.option("--endpoint", default=DEFAULT_ENDPOINT, show_default=True,
              help="The server's REST address.")
@click.option("--region", metavar="REGION",
              help="gcloud's regional endpoint: checked, and said to change nothing "
                   "(the request goes to --endpoint).")
@formats.FORMAT_OPTION
def predict_command(model, version, json_instances, json_request, text_instances,
                    signature_name, endpoint, region, fmt):
    """Online prediction against a running server, as `gcloud ai-platform predict`."""
    from submit.jobdef import version_config
    if version_config.check_region(region):
        echo(f"--region {region}: gcloud's regional endpoint; the request goes to "
             f"--endpoint {endpoint}", err=True)
    given = [(f, v) for f, v in (("--json-instances", json_instances),
                                 ("--json-request", json_request),
                                 ("--text-instances", text_instances)) if v is not None]
    if len(given) != 1:
        raise UsageError("give exactly one of --json-instances, --json-request or "
                         "--text-instances")
    url = urllib.parse.urlsplit(endpoint)
    if url.scheme not in ("http", "https") or not url.hostname or url.path.strip("/") \
            or url.query:
        raise UsageError(f"--endpoint {endpoint!r:.80} is not a server's address; write "
                         f"e.g. {DEFAULT_ENDPOINT}")
    if fmt:
        formats.parse(fmt)  # a mistake is found before anything is sent
    flag, source = given[0]
    body: dict = {"instances": instances_from(flag, read_input(source, flag))}
    if signature_name:
        body["signature_name"] = signature_name
    target = endpoint.rstrip("/") + model_path(model, version) + ":predict"
    answer = post(target, body)
    predictions = answer.get("predictions")
    if not isinstance(predictions, list):
        raise SubmitError(f"{target} answered without predictions: {str(answer)[:200]}")
    if fmt and formats.parse(fmt)[0] in ("table", "value"):
        rows = [p if isinstance(p, dict) else {"prediction": p} for p in predictions]
        formats.emit(echo, rows, fmt, single=False,
                     default_keys=[(k, formats.heading(k)) for k in rows[0]]
                     if rows else [])
    else:
        formats.emit(echo, [{"predictions": predictions}], fmt or "json", single=True)
    return EXIT_OK


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            data = response.read(64 * 1024 * 1024)
    except urllib.error.HTTPError as exc:
        text = exc.read(64 * 1024).decode("utf-8", "replace")
        try:
            reason = json.loads(text).get("error") or text
        except (ValueError, AttributeError):
            reason = text
        raise SubmitError(f"{url} answered HTTP {exc.code}: {str(reason)[:300]}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SubmitError(f"cannot reach {url} ({reason}); start a server with `python "
                          "-m predict serve` or pass its --endpoint") from None
    try:
        answer = json.loads(data)
    except ValueError:
        raise SubmitError(f"{url} answered with something other than JSON") from None
    return answer if isinstance(answer, dict) else {}
