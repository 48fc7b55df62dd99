"""TF Serving's REST API (v1) for the served models: what its routes answer.

The process around it (ports, uvicorn, gRPC, signals) is predict.serving.listen.

Routes (everything else is 404, a known route with the wrong method 405):
  GET  /v1/models/NAME[/versions/N | /labels/LABEL]            status
  GET  /v1/models/NAME[/versions/N | /labels/LABEL]/metadata   signatures
  POST /v1/models/NAME[/versions/N | /labels/LABEL]:predict    predictions
  POST /v1/models/NAME[...]:classify, :regress                 tf.Example inference
  GET  /healthz (and AIP_HEALTH_ROUTE)                         health (predict.api.health)
  POST AIP_PREDICT_ROUTE                                       Vertex AI's predict
  GET  the monitoring config's Prometheus path                 metrics, when enabled

Which versions exist is the repository's business (`predict.models.repository`): one export
served as version 1, or numbered versions under a watched base path. A request without
a version goes to the highest available one.
Each request's JSON decoding, checking, model call and encoding run on the pool
(predict.runtime.calls, which decides how every call runs, for gRPC too), so the event loop
keeps accepting and reading requests while TensorFlow works. The
version a request started with stays loaded until it has answered. Bodies are counted
while they are read and refused with 413 past --max-body-bytes: the rest is drained,
not kept, so the client still gets the answer.
"""
from __future__ import annotations

import logging
import re
from contextlib import contextmanager

from predict.runtime import decode, inference, loop
from predict.models import request_log
from predict.runtime.batching import Unavailable
from predict.runtime.calls import Calls, DeadlineExceeded
from predict.errors import InputError, InstanceError, UsageError, clip
from predict.runtime.instances import parse_json_bytes
from predict.api.http import ClientDisconnect, Request, dumps
from predict.models.repository import NotFoundError, Repository, ServedModel
from predict.models.versions import MAX_VERSION
from mljob.errors import ascii_digits

log = logging.getLogger("predict.server")
REST_HEALTH = "/healthz"

DRAIN_LIMIT = 64 * 1024 * 1024  # past this an oversized body is cut off, not drained
_ROUTE = re.compile(r"^/v1/models/(?P<name>[^/:]+)"
                    r"(?:/versions/(?P<version>[^/:]+)|/labels/(?P<label>[^/:]+))?"
                    r"(?P<rest>/metadata|:[A-Za-z_]+)?/?$")
JSON = b"application/json"
# TF Serving's CORS headers (http_rest_api_util.cc), on its REST API's answers with
# --rest_api_enable_cors_support; its REST dispatcher takes paths under /v1/
CORS_HEADERS = {"Access-Control-Allow-Origin": "*",
                "Access-Control-Allow-Methods": "POST, GET",
                "Access-Control-Allow-Headers": "Content-Type"}
_ORIGIN = re.compile(r"https?://")


class HTTPError(Exception):
    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


class PredictionService:
    """What the routes do, independent of the HTTP plumbing."""

    def __init__(self, repository: Repository, *, max_body_bytes: int,
                 max_instances: int, threads: int, metrics=None, batcher=None,
                 timeout_s: float = 30.0, metrics_path: str | None = None,
                 health=None, vertex: dict | None = None, cors: bool = False):
        self.repository = repository
        self.cors = cors
        self.max_body_bytes = max_body_bytes
        self.max_instances = max_instances
        self.metrics = metrics
        self.metrics_path = metrics_path if metrics is not None else None
        self.batcher = batcher
        self.timeout_s = timeout_s
        self.health = health
        self.vertex = vertex or {}  # health_route, predict_route, model
        self.loggers = request_log.Loggers()  # each model's logging_config
        self.calls = Calls(threads, batcher=batcher, timeout_s=timeout_s)

    async def handle(self, request: Request) -> tuple:
        """-> (status, body, headers, content type); with CORS on, the API's answers
        carry TF Serving's CORS headers."""
        status, body, headers, media_type = await self._handle(request)
        if self.cors and request.path[:4].lower() == "/v1/":
            headers = {**headers, **CORS_HEADERS}
        return status, body, headers, media_type

    async def _handle(self, request: Request) -> tuple:
        path = request.path
        if request.method == "OPTIONS" and path[:4].lower() == "/v1/":
            # a CORS preflight, answered as TF Serving answers it (with CORS off too)
            if _ORIGIN.search(request.header(b"origin")):
                return 200, b"", {}, JSON
            return 400, dumps({"error": "Origin header is missing in CORS preflight"}), \
                {}, JSON
        if self.metrics_path is not None and path == self.metrics_path:
            return 200, self.metrics.exposition(), {}, self.metrics.CONTENT_TYPE.encode()
        if self.health is not None and path in (REST_HEALTH, self.vertex.get("health_route")) \
                and request.method == "GET":
            ok, models = self.health.ready()
            return (200 if ok else 503), dumps({
                "status": "SERVING" if ok else "NOT_SERVING",
                "models": {n: [str(v) for v in vs] for n, vs in models.items()}}), {}, JSON
        timer = self.metrics.timer("REST") if self.metrics is not None else None
        try:
            if self.vertex.get("predict_route") == path:
                status, body = await self._vertex_predict(request, timer)
            else:
                status, body = await self._route(request, timer)
        except HTTPError as exc:
            status, body = exc.status, dumps({"error": clip(str(exc))})
            headers = exc.headers
        except ClientDisconnect:  # the client's doing, not a server fault: no traceback
            log.info("request %s %s: the client disconnected before sending its whole "
                     "body", request.method, request.path)
            status, body, headers = 499, b"", {}  # nginx's code; nobody reads it
        except Exception:  # a real fault: log it, answer 500
            log.exception("request %s %s failed", request.method, request.path)
            status = 500
            body = dumps({"error": "internal server error; see the server's log"})
            headers = {}
        else:
            headers = {}
        if timer is not None:
            timer.done(status)
        return status, body, headers, JSON

    async def _route(self, request: Request, timer=None):
        match = _ROUTE.match(request.path)
        if not match:
            names = sorted(self.repository.models)
            raise HTTPError(404, f"no route {request.path}; the API is "
                                 f"/v1/models/{names[0] if len(names) == 1 else 'NAME'}"
                                 "[/versions/N|/labels/LABEL][:predict|/metadata]")
        name, rest, label = match["name"], match["rest"], match["label"]
        served = self._served(name)
        version = _version(name, match["version"])
        if timer is not None:
            timer.model_name = name
        verbs = {":predict": ("Predict", self.predict_json),
                 ":classify": ("Classify", self.classify_json),
                 ":regress": ("Regress", self.regress_json)}
        if rest in verbs:
            _allow(request, "POST")
            body = await self._read_body(request)
            api, fn = verbs[rest]
            if timer is not None:
                timer.api = api
            return 200, await self._in_pool(fn, body, served, version, label)
        if rest is not None and rest.startswith(":"):
            raise HTTPError(404, f"unknown method {rest}; this server answers :predict, "
                                 ":classify and :regress")
        _allow(request, "GET")
        try:
            if rest == "/metadata":
                if timer is not None:
                    timer.api = "GetModelMetadata"
                payload = self.metadata(served, version, label)
            else:
                if timer is not None:
                    timer.api = "GetModelStatus"
                payload = {"model_version_status": served.status(version, label)}
        except NotFoundError as exc:
            raise HTTPError(404, str(exc)) from None
        return 200, dumps(payload)

    async def _in_pool(self, fn, *args):
        """fn(*args) as predict.runtime.calls runs a REST request; past --rest_api_timeout_in_ms
        the client gets 504 (TF Serving's DEADLINE_EXCEEDED)."""
        try:
            return await self.calls.rest(fn, *args)
        except DeadlineExceeded as exc:
            raise HTTPError(504, str(exc)) from None

    async def _vertex_predict(self, request: Request, timer=None):
        """Vertex AI's predict route: {"instances": [...], "parameters": {...}} for the
        container's model; answers {"predictions": [...]}."""
        _allow(request, "POST")
        served = self._served(self.vertex["model"])
        if timer is not None:
            timer.model_name, timer.api = served.name, "Predict"
        raw = await self._read_body(request)
        return 200, await self._in_pool(self.predict_json, raw, served, None, None, True)

    def _served(self, name: str) -> ServedModel:
        try:
            return self.repository.get(name)
        except NotFoundError as exc:
            raise HTTPError(404, str(exc)) from None

    async def _read_body(self, request: Request) -> bytes:
        limit = self.max_body_bytes
        declared = request.header(b"content-length")
        too_big = HTTPError(413, f"request body exceeds {limit} bytes (--max-body-bytes); "
                                 "send fewer instances a request")
        if ascii_digits(declared) and int(declared) > DRAIN_LIMIT:
            raise too_big
        chunks: list[bytes] | None = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                chunks = None  # keep draining so the client reads our answer, keep nothing
                if size > DRAIN_LIMIT:
                    break
            elif chunks is not None:
                chunks.append(chunk)
        if chunks is None:
            raise too_big
        return b"".join(chunks)

    def predict_json(self, raw: bytes, served: ServedModel, version: int | None = None,
                     label: str | None = None, vertex: bool = False) -> bytes:
        """A :predict body -> the answer's bytes (runs in the thread pool)."""
        body = _parse_body(raw)
        if vertex and isinstance(body, dict) and "parameters" in body:
            if body["parameters"] not in ({}, None):
                raise HTTPError(400, "parameters: a SavedModel signature takes no "
                                     "parameters; send only \"instances\"")
            body = {k: v for k, v in body.items() if k != "parameters"}
        with self._answering():
            with served.use(version, label) as (number, model):
                model = self._batched(model, served, number)
                logger = self.loggers.get(served)
                tap = request_log.Tap(model) if logger and logger.sampled() else None
                answer = dumps(self.predict(body, tap or model))
                if tap is not None and tap.calls:
                    batch, outputs, signature = tap.calls[0]
                    self._log(logger, "predict_log", request_log.predict_messages(
                        served.name, number, signature, batch, outputs))
                return answer

    def classify_json(self, raw: bytes, served: ServedModel, version: int | None = None,
                      label: str | None = None) -> bytes:
        return self._example_json(raw, served, version, label, classify=True)

    def regress_json(self, raw: bytes, served: ServedModel, version: int | None = None,
                     label: str | None = None) -> bytes:
        return self._example_json(raw, served, version, label, classify=False)

    def _example_json(self, raw, served, version, label, *, classify: bool) -> bytes:
        """:classify / :regress, TF Serving's JSON: {"result": [[[label, score], ...]]}
        or {"result": [value, ...]}."""
        body = _parse_body(raw)
        with self._answering():
            if not isinstance(body, dict):
                raise InputError("request", "must be a JSON object with \"examples\"")
            name = body.get("signature_name")
            if name is not None and not isinstance(name, str):
                raise InputError("request", "signature_name must be a string")
            records = inference.examples_from_json(body, self.max_instances)
            with served.use(version, label) as (number, model):
                model = self._batched(model, served, number)
                if classify:
                    used, rows = inference.classify(model, name, records)
                    result: list = [[[lab, score] for lab, score in row] for row in rows]
                else:
                    used, rows = inference.regress(model, name, records)
                    result = rows
                logger = self.loggers.get(served)
                if logger is not None and logger.sampled():
                    kind = "classify_log" if classify else "regress_log"
                    self._log(logger, kind, request_log.example_messages(
                        kind, served.name, number, used, records, rows))
                return dumps({"result": result})

    @staticmethod
    def _log(logger, kind: str, messages) -> None:
        request, response = messages
        try:
            logger.write(kind, response.model_spec, request, response)
        except Exception:  # a full disk must not fail the request
            log.exception("cannot write the request log %s", logger.path)

    @contextmanager
    def _answering(self):
        try:
            yield
        except NotFoundError as exc:
            raise HTTPError(404, str(exc)) from None
        except Unavailable as exc:
            raise HTTPError(503, str(exc)) from None
        except (InputError, InstanceError, UsageError) as exc:
            raise HTTPError(400, str(exc)) from None

    def _batched(self, model, served: ServedModel, version: int = 0):
        return self.calls.model_for(model, served.name, version)

    def predict(self, body, model) -> dict:
        sig, batch, finish = self._predict_call(body, model)
        return finish(model.predict(batch, sig.name))

    def _predict_call(self, body, model) -> tuple:
        """A :predict body checked and decoded: (signature, batch, finish(outputs) ->
        the answer's JSON-able object)."""
        if not isinstance(body, dict):
            raise InputError("request", "must be a JSON object with \"instances\" or "
                                        "\"inputs\"")
        unknown = sorted(set(body) - {"instances", "inputs", "signature_name"})
        if unknown:
            raise InputError("request", f"unknown key {unknown[0]!r}; use \"instances\" or "
                                        "\"inputs\", and optionally \"signature_name\"")
        if ("instances" in body) == ("inputs" in body):
            raise InputError("request", "give exactly one of \"instances\" (row format) "
                                        "and \"inputs\" (columnar format)")
        name = body.get("signature_name")
        if name is not None and not isinstance(name, str):
            raise InputError("request", "signature_name must be a string")
        sig = model.signature(name)
        if "instances" in body:
            instances = body["instances"]
            if not isinstance(instances, list) or not instances:
                raise InputError("request", "\"instances\" must be a non-empty list")
            self._check_count(len(instances))
            decoded = loop.decode_labelled(
                ((f"instance {i}", x) for i, x in enumerate(instances)), sig)
            batch, finish = loop.rows_call(decoded, sig)
            return sig, batch, lambda outputs: {"predictions": finish(outputs)}
        try:
            batch = decode.decode_columns(body["inputs"], sig)
        except InstanceError as exc:
            raise InputError("inputs", str(exc)) from None
        self._check_count(next(iter(batch.values())).shape[0])
        finish = loop.columns_finish(batch, sig)
        return sig, batch, lambda outputs: {"outputs": finish(outputs)}

    def _check_count(self, count: int) -> None:
        if count > self.max_instances:
            raise InputError("request", f"{count} instances; this server takes at most "
                                        f"{self.max_instances} a request (--max-instances)")

    def metadata(self, served: ServedModel, version: int | None = None,
                 label: str | None = None) -> dict:
        with served.use(version, label) as (number, model):
            return {"model_spec": {"name": served.name, "signature_name": "",
                                   "version": str(number)},
                    "metadata": {"signature_def": {"signature_def": signature_defs(model)}}}


def _parse_body(raw: bytes):
    try:
        return parse_json_bytes(raw)
    except UnicodeDecodeError:
        raise HTTPError(400, "request body is not UTF-8 JSON") from None
    except InstanceError as exc:
        raise HTTPError(400, f"request body: {str(exc).replace('empty line', 'empty body')}") \
            from None


def signature_defs(model) -> dict:
    """The SignatureDefs of a model in TF Serving's JSON shape."""
    def tensors(infos):
        return {k: {"dtype": info.dtype_enum_name,
                    "tensor_shape": _tensor_shape(info.shape),
                    "name": info.tensor_name} for k, info in infos.items()}
    return {name: {"inputs": tensors(sig.inputs), "outputs": tensors(sig.outputs),
                   "method_name": sig.method_name}
            for name, sig in model.signatures.items()}


def _version(name: str, text: str | None) -> int | None:
    if text is None:
        return None
    if not ascii_digits(text) or len(text) > 19 or \
            int(text) > MAX_VERSION:  # int() refuses 4,300 digits: a 500 before
        raise HTTPError(404, f"model {name!r} has no version {text!r:.40}; versions are "
                             f"numbers from 0 to {MAX_VERSION}")
    return int(text)


def _allow(request: Request, method: str) -> None:
    if request.method != method:
        raise HTTPError(405, f"{request.method} is not allowed here; use {method}",
                        {"Allow": method})


def _tensor_shape(shape) -> dict:
    if shape is None:
        return {"dim": [], "unknown_rank": True}
    return {"dim": [{"size": str(-1 if d is None else d), "name": ""} for d in shape],
            "unknown_rank": False}


__all__ = ["PredictionService", "HTTPError", "signature_defs"]
