"""--rest_api_enable_cors_support as TF Serving does it (http_server.cc,
http_rest_api_util.cc): the API's answers under /v1/ carry Access-Control-Allow-Origin
*, methods POST, GET and header Content-Type; a preflight (OPTIONS) is answered 200
when its Origin is an http(s) origin and 400 without one, with CORS on or off."""
import asyncio
import json

import pytest

from predict.api import http as rest_http, rest as server


class NoModels:
    models: dict = {}

    def get(self, name):
        from predict.models.repository import NotFoundError
        raise NotFoundError(f"model {name!r} not found")


def ask(cors: bool, method: str, path: str, origin: str | None = None):
    service = server.PredictionService(NoModels(), max_body_bytes=1 << 20,
                                       max_instances=10, threads=1, cors=cors)
    headers = [(b"origin", origin.encode())] if origin is not None else []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}
    request = rest_http.Request({"method": method, "path": path, "headers": headers},
                                receive)
    try:
        return asyncio.run(service.handle(request))
    finally:
        service.calls.close()


@pytest.mark.parametrize("cors", [True, False])
def test_preflight_answers_and_headers(cors):
    status, body, headers, _ = ask(cors, "OPTIONS", "/v1/models/m:predict",
                                   origin="http://localhost:3000")
    assert (status, body) == (200, b"")
    assert (headers == server.CORS_HEADERS) is cors
    status, body, headers, _ = ask(cors, "OPTIONS", "/v1/models/m:predict")
    assert status == 400
    assert json.loads(body) == {"error": "Origin header is missing in CORS preflight"}
    assert (headers.get("Access-Control-Allow-Origin") == "*") is cors


def test_every_api_answer_carries_them_errors_too():
    status, _, headers, _ = ask(True, "GET", "/v1/models/nothing")
    assert status == 404
    assert headers["Access-Control-Allow-Methods"] == "POST, GET"
    assert headers["Access-Control-Allow-Headers"] == "Content-Type"
    status, _, headers, _ = ask(False, "GET", "/v1/models/nothing")
    assert status == 404 and "Access-Control-Allow-Origin" not in headers
