"""predict.rest_http subclasses uvicorn's HTTP protocols, which are private: setup.py
pins the uvicorn range tested, and this test fails loudly (rather than the server
silently losing its JSON errors or its one-write answers) when an installed uvicorn
moves what rest_http overrides or reaches into."""
import inspect
import re

import pytest
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from predict import rest_http

SETUP = open(__import__("os").path.join(__import__("os").path.dirname(__file__), "..", "..",
                                        "setup.py")).read()


def test_the_installed_uvicorn_is_in_the_pinned_range():
    low, high = re.search(r'"uvicorn>=([0-9.]+),<([0-9.]+)"', SETUP).groups()
    version = tuple(int(p) for p in uvicorn.__version__.split(".")[:2])
    assert tuple(int(p) for p in low.split(".")) <= version < \
        tuple(int(p) for p in high.split(".")), (
        f"uvicorn {uvicorn.__version__} is outside setup.py's tested range "
        f">={low},<{high}: check predict/rest_http.py against it, then move the range")


def test_what_rest_http_overrides_is_still_there():
    # h11: send_400_response writes h11 events to self.transport through self.conn
    source = inspect.getsource(H11Protocol.send_400_response)
    assert "self.conn.send(" in source and "self.transport.write(" in source
    if rest_http.httptools is None:
        pytest.skip("httptools is not installed: the h11 protocol serves")
    from uvicorn.protocols.http.httptools_impl import (HttpToolsProtocol,
                                                       RequestResponseCycle)
    # the parser is self.parser (wrapped to see refused methods), built in __init__
    assert "self.parser = httptools.HttpRequestParser(self)" in \
        inspect.getsource(HttpToolsProtocol.__init__)
    assert "self.parser.feed_data(" in inspect.getsource(HttpToolsProtocol.data_received)
    # each request's cycle is self.cycle, made in on_headers_complete with the
    # connection's transport, which OneWrite replaces; the cycle writes through it
    heads = inspect.getsource(HttpToolsProtocol.on_headers_complete)
    assert "self.cycle = RequestResponseCycle(" in heads and \
        "transport=self.transport" in heads
    assert "self.transport.write(" in inspect.getsource(RequestResponseCycle.send)
    assert "scope" in inspect.signature(RequestResponseCycle.__init__).parameters
    # a parse error is answered by send_400_response
    assert "self.send_400_response(" in inspect.getsource(HttpToolsProtocol.data_received)
