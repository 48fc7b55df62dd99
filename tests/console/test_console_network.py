"""The console's network modes over real HTTP (`python -m submit console` in its own
process; httpx and raw sockets as clients): on 0.0.0.0 it asks for the token it printed
once, on every bind a Host outside the allow-list is refused (DNS rebinding), a token from
a file, the command's refusals, and the cancel form's size limit enforced before its body
is read. The same in Chromium is in test_console_browser.py."""
from __future__ import annotations

import re
import socket
import subprocess
import sys
import time

import httpx
import pytest

from submit import jobs as records
from submit.console import guard
from submit.errors import UsageError
from tests.console.test_console_http import stored_job
from tests.support.browser import start_console
from tests.support.common import ROOT


def printed_token(log_path) -> str:
    text = open(log_path).read()
    assert text.count("?token=") == 1, text  # printed once, with the address
    return re.search(r"\?token=(\S+) ", text)[1]


def test_a_console_on_every_address_needs_its_token(tmp_path, reaper):
    stored_job(tmp_path)
    url = start_console(reaper, tmp_path / "console.log", "--host", "0.0.0.0")
    token = printed_token(tmp_path / "console.log")
    port = url.rsplit(":", 1)[1]
    here = f"{socket.gethostname()}:{port}"  # a name the network reaches it by
    with httpx.Client(base_url=url, timeout=30) as client:
        # without the token: no page, from the network's name and from loopback alike
        for host in (here, f"127.0.0.1:{port}"):
            for path in ("/", "/jobs/fake01", "/jobs/fake01/logs", "/jobs/fake01/curves",
                         "/rows"):
                answer = client.get(path, headers={"Host": host})
                assert answer.status_code == 403, (host, path)
                assert "needs its token" in answer.text and "line 1" not in answer.text
        wrong = client.get("/jobs/fake01", headers={"Host": here,
                                                    "Authorization": "token " + "x" * 43})
        assert wrong.status_code == 403
        # a foreign name (a rebinding page) is refused even with the token
        for headers in ({"Host": "evil.example"},
                        {"Host": f"evil.example:{port}", "Authorization": f"token {token}"}):
            assert client.get("/jobs/fake01", headers=headers).status_code == 421
        # with the token: the pages, by header or by the printed address (then a cookie)
        page = client.get("/jobs/fake01", headers={"Host": here,
                                                   "Authorization": f"token {token}"})
        assert page.status_code == 200 and "master-replica-0" in page.text
        opened = client.get("/jobs/fake01", params={"token": token}, headers={"Host": here})
        assert opened.status_code == 303
        root = opened.headers["location"].removesuffix("/jobs/fake01")
        assert re.fullmatch(r"/console/[\w-]{32}", root), opened.headers["location"]
        cookie = opened.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert f"path={root.lower()}" in cookie and token.lower() not in cookie
        page = client.get(f"{root}/jobs/fake01", headers={"Host": here})  # the cookie now
        assert page.status_code == 200 and f'<base href="{root}/">' in page.text
        # the cookie goes with the console's own path only
        assert client.get("/jobs/fake01", headers={"Host": here}).status_code == 403
        csrf = re.search(r'name=csrf value="([^"]+)"', page.text)[1]
        cancelled = client.post(f"{root}/jobs/fake01/cancel", data={"csrf": csrf},
                                headers={"Host": here, "Origin": f"http://{here}"})
        assert cancelled.status_code == 303
        assert cancelled.headers["location"] == f"{root}/jobs/fake01"
    assert records.load("fake01").state == records.CANCELLED


def test_a_token_from_a_file_and_the_allowed_hosts(tmp_path, reaper):
    stored_job(tmp_path)
    token_file = tmp_path / "token"
    token_file.write_text("a-token-of-the-users-own-1234\n")
    log = tmp_path / "console.log"
    url = start_console(reaper, log, "--token-file", str(token_file), "--allowed-hosts",
                        "jobs.example.org, Console.Test")
    assert "?token=" not in open(log).read()  # the user has it: not printed
    port = url.rsplit(":", 1)[1]
    auth = {"Authorization": "Bearer a-token-of-the-users-own-1234"}
    with httpx.Client(base_url=url, timeout=30) as client:
        assert client.get("/", headers={"Host": f"console.test:{port}"}).status_code == 403
        for host in (f"console.test:{port}", "jobs.example.org", f"localhost:{port}",
                     f"[::1]:{port}"):
            assert client.get("/", headers={"Host": host, **auth}).status_code == 200, host
        for host in ("other.example", "jobs.example.org.evil.example", "", "127.0.0.2"):
            assert client.get("/", headers={"Host": host, **auth}).status_code == 421, host


def _raw(port: int, head: bytes, body: bytes = b"", wait: float = 10.0) -> bytes:
    """Send a request's head (and a piece of its body) and read the answer's status line
    without sending the rest: a server that reads the whole body first never answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        sock.sendall(head + body)
        answer = b""
        while b"\r\n" not in answer:
            piece = sock.recv(4096)
            if not piece:
                break
            answer += piece
        return answer.split(b"\r\n", 1)[0]


def test_the_cancel_forms_limit_is_kept_before_its_body_is_read(tmp_path, reaper):
    stored_job(tmp_path)
    url = start_console(reaper, tmp_path / "console.log")
    port = int(url.rsplit(":", 1)[1])
    origin = f"Host: 127.0.0.1:{port}\r\nOrigin: {url}\r\n"
    started = time.monotonic()
    # 200 MB declared, 10 bytes sent: refused at once, nothing waited for
    status = _raw(port, f"POST /jobs/fake01/cancel HTTP/1.1\r\n{origin}Content-Type: "
                        "application/x-www-form-urlencoded\r\nContent-Length: 200000000\r\n"
                        "\r\n".encode(), b"csrf=xxxxx")
    assert status.startswith(b"HTTP/1.1 413"), status
    # chunked, no length: refused once past the limit, before the body ends
    status = _raw(port, f"POST /jobs/fake01/cancel HTTP/1.1\r\n{origin}Transfer-Encoding: "
                        "chunked\r\n\r\n".encode(), b"2000\r\n" + b"a" * 0x2000 + b"\r\n")
    assert status.startswith(b"HTTP/1.1 413"), status
    assert time.monotonic() - started < 8
    assert records.load("fake01").state == records.RUNNING


def test_bad_tokens_and_hosts_are_one_line(tmp_path):
    for argv, fragment in [
            (["--token", "short"], "--token: a token must be at least 16 printable ASCII"),
            (["--allowed-hosts", "*"], "--allowed-hosts '*' on a loopback address needs a "
                                       "token")]:
        out = subprocess.run([sys.executable, "-m", "submit", "console", "--port", "0",
                              *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, argv
        assert out.stderr.count("\n") == 1 and fragment in out.stderr, (argv, out.stderr)
        assert out.stdout == ""
    missing, empty = tmp_path / "no-such-token", tmp_path / "empty"
    empty.write_text("\n")
    for given, path, fragment in [
            ("x" * 20, str(missing), "both given; use one"),
            (None, str(missing), f"--token-file {missing} cannot be read"),
            (None, str(empty), f"--token-file {empty}: a token must be at least 16"),
            ("x" * 15 + "\u00e9", None, "a token must be at least 16 printable ASCII")]:
        with pytest.raises(UsageError, match=re.escape(fragment)):
            guard.read_token(given, path)
