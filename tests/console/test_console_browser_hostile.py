"""The console's defences in a real browser (Playwright driving Debian's Chromium): a DNS
rebinding page (served under a name, then that name's port answered by the console)
reads no job page and cancels nothing, under `--allowed-hosts 'jobs.example.org, *'`
(which needs a token) and under a list without `*`; and the token's cookie, set by
`/?token=`, never reaches a plain server on another port of 127.0.0.1. Names resolve to
127.0.0.1 inside this Chromium only (`--host-resolver-rules`)."""
from __future__ import annotations

import contextlib
import http.server
import threading

import pytest

from submit import jobs as records
from tests.console.test_console_http import stored_job
from tests.support.browser import chromium, skip_reason, start_console
from tests.support.common import free_ports

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))

TOKEN = "a-token-the-user-keeps-in-a-file-1234"
RULES = "--host-resolver-rules=MAP evil.test 127.0.0.1, MAP jobs.example.org 127.0.0.1"

# The attacker's page: it keeps asking its own origin for a job page until something
# other than its own server answers (the console, once the name "rebinds" to it), then
# tries the cancel form with whatever token the page held.
REBINDING_PAGE = b"""<!doctype html><title>cats</title><body><script>
async function attack() {
  for (;;) {
    try {
      const r = await fetch("/jobs/fake01", {cache: "no-store"});
      if (!r.headers.get("x-attacker")) {
        const text = await r.text();
        const csrf = (text.match(/name=csrf value="([^"]+)"/) || [, "none"])[1];
        const c = await fetch("/jobs/fake01/cancel", {method: "POST", body:
          new URLSearchParams({csrf}), redirect: "manual"});
        document.body.dataset.text = text;
        document.body.dataset.cancel = String(c.status);
        document.body.dataset.status = String(r.status);
        return;
      }
    } catch (e) {}
    await new Promise(ok => setTimeout(ok, 100));
  }
}
attack();
</script>"""


class _Plain(http.server.BaseHTTPRequestHandler):
    """A plain local server: the attacker's page at /, 404 elsewhere; every request's
    Cookie header kept."""
    seen: list[tuple[str, str]] = []

    def do_GET(self):
        self.seen.append((self.path, self.headers.get("Cookie") or ""))
        body = REBINDING_PAGE if self.path == "/" else b"not here"
        self.send_response(200 if self.path == "/" else 404)
        self.send_header("Content-Type", "text/html")
        self.send_header("X-Attacker", "1")
        self.send_header("Connection", "close")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def plain_server(port: int):
    _Plain.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Plain)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def rebind(tmp_path, reaper, page, name: str, *argv: str) -> dict[str, str]:
    """The attacker's page opened at http://NAME:PORT/, its server stopped, the console
    started on PORT (with argv): what the page read once the console answered."""
    port = free_ports(1)[0]
    with plain_server(port):
        page.goto(f"http://{name}:{port}/")
        assert page.title() == "cats"
    start_console(reaper, tmp_path / f"console-{port}.log", *argv, port=port)
    page.wait_for_function("() => document.body.dataset.status", timeout=60_000)
    return page.evaluate("() => ({...document.body.dataset})")


def test_a_rebinding_page_reads_no_job_and_cancels_nothing(tmp_path, reaper):
    stored_job(tmp_path)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    with chromium(tmp_path / "profile", RULES) as page:
        # the attack as it was: 'jobs.example.org, *' without a token; the console no
        # longer starts (it took any Host, and the page read the job and cancelled it)
        with pytest.raises(RuntimeError, match="'\\*' on a loopback address needs a token"):
            rebind(tmp_path, reaper, page, "evil.test", "--allowed-hosts",
                   "jobs.example.org, *")
        # '*' after a space is '*': the console takes it only with its token, which the
        # rebinding page does not have
        got = rebind(tmp_path, reaper, page, "evil.test", "--allowed-hosts",
                     "jobs.example.org, *", "--token-file", str(token_file))
        assert got["status"] == "403" and got["cancel"] == "403", got
        assert "master-replica" not in got["text"] and "csrf" not in got["text"]
        # without '*' and without a token: the Host check refuses the rebinding name
        got = rebind(tmp_path, reaper, page, "evil.test", "--allowed-hosts",
                     "jobs.example.org, ")
        assert got["status"] == "421" and got["cancel"] == "421", got
        assert "master-replica" not in got["text"]
        assert records.load("fake01").state == records.RUNNING
        # the control: the same page under an allowed name is the console's own origin,
        # reads the job and its form token, and its cancel passes (so what refused
        # evil.test above was its name, and the token)
        got = rebind(tmp_path, reaper, page, "jobs.example.org", "--allowed-hosts",
                     " JOBS.example.org ,")
        assert got["status"] == "200" and "master-replica-0" in got["text"], got
        assert got["cancel"] == "0"  # the redirect after a cancel (opaque to fetch)
    assert records.load("fake01").state == records.CANCELLED


def test_the_token_cookie_reaches_no_other_port(tmp_path, reaper):
    """Browsers send a host's cookies to all its ports: after `/?token=T`, a plain server
    on another port of 127.0.0.1 sees neither the token nor the console's cookie, at its
    root, at the console's public paths, or at the job's."""
    stored_job(tmp_path)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    url = start_console(reaper, tmp_path / "console.log", "--token-file", str(token_file))
    other = free_ports(1)[0]
    with chromium(tmp_path / "profile") as page, plain_server(other):
        page.goto(f"{url}/?token={TOKEN}")
        root = page.url[len(url):].rstrip("/")
        assert root.startswith("/console/") and TOKEN not in page.url
        page.click('a[href="jobs/fake01"]')  # the console's own links, through its cookie
        page.wait_for_function("() => document.getElementById('logs').dataset.ended",
                               timeout=30_000)
        assert page.url == f"{url}{root}/jobs/fake01"
        assert "master-replica-0\tline 3" in page.locator("#logs").text_content()
        cookies = page.context.cookies()
        assert [c["path"] for c in cookies] == [root] and cookies[0]["httpOnly"]
        held = cookies[0]["value"]
        for path in ("/", "/jobs/fake01", "/console/", "/static/console.css",
                     f"/?token={TOKEN[:4]}"):
            page.goto(f"http://127.0.0.1:{other}{path}")
        sent = " ".join(cookie for _, cookie in _Plain.seen)
        assert {"/", "/console/", "/static/console.css"} <= {p for p, _ in _Plain.seen}
        assert held not in sent and TOKEN not in sent, _Plain.seen
        # the control: the browser does send it to another port for the console's own
        # path, which only a holder of the token can name (docs/console.md)
        page.goto(f"http://127.0.0.1:{other}{root}/")
        assert held in _Plain.seen[-1][1] and TOKEN not in _Plain.seen[-1][1]
