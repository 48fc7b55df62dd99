"""The console against a hostile network, over real HTTP (`python -m submit console` in its
own process; httpx as the client): on 0.0.0.0 with a token, no request without it
reaches a job page or cancel whatever its Host, Origin, cookie, header or query;
`--allowed-hosts` is used as it is checked (`' *'` is `*`); filters that took a minute
under a backtracking engine answer at once, off the event loop, and never for another
site; the console obeys SIGTERM. The same attacks in Chromium are in
test_console_browser_hostile.py."""
from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from submit import jobs as records
from submit.console import guard
from submit.errors import UsageError
from tests.console.test_console_http import stored_job
from tests.console.test_console_network import printed_token
from tests.support.browser import start_console
from tests.support.common import ROOT

# each took 60 s to 23 minutes under Python's backtracking re on one label value
ATTACKS = ["labels.k~'^((a+))+$'", "labels.k~'^(a|a|a|a|a|a|a|a)*$'",
           "labels.k~'^(a|aa|aaa|aaaa|a|aa|aaa|aaaa)+$'", "labels.k~'^((a*)*)*$'"]


def test_no_request_without_the_token_reaches_a_page_or_cancel(tmp_path, reaper):
    stored_job(tmp_path)
    url = start_console(reaper, tmp_path / "console.log", "--host", "0.0.0.0")
    token = printed_token(tmp_path / "console.log")
    port = url.rsplit(":", 1)[1]
    here = f"{socket.gethostname()}:{port}"
    name = f"mljob-console-{port}"
    wrong = "w" * len(token)
    cookies = [None, f"{name}={wrong}", f"{name}={token}", f"{name}=",
               f"{name}={token}; {name}={wrong}", f"token={token[:-1]}"]
    headers = [{}, {"Authorization": f"token {wrong}"}, {"Authorization": f"Bearer {token}x"},
               {"Authorization": "token"}, {"Authorization": f"Basic {token}"}]
    queries = ["", f"?token={wrong}", "?token=", f"?token={token[:-1]}",
               f"?token={token}x", f"?token=%00{token}"]
    paths = ["/jobs/fake01", "/console/jobs/fake01", f"/console/{wrong[:32]}/jobs/fake01",
             "/static/../jobs/fake01"]
    with httpx.Client(base_url=url, timeout=30) as client:
        tried = 0
        for host in (here, f"127.0.0.1:{port}", f"localhost:{port}", "evil.example"):
            for origin in (None, f"http://{here}", "http://evil.example"):
                for cookie in cookies:
                    for extra in headers:
                        for query in queries:
                            for path in paths:
                                sent = {"Host": host, **extra}
                                if origin:
                                    sent["Origin"] = origin
                                if cookie:
                                    sent["Cookie"] = cookie
                                tried += 1
                                if tried % 11:  # a spread of the combinations, both verbs
                                    continue
                                for answer in (client.get(path + query, headers=sent),
                                               client.post(path + "/cancel" + query,
                                                           headers=sent,
                                                           data={"csrf": wrong})):
                                    assert answer.status_code in (403, 404, 421), \
                                        (answer.status_code, sent, path + query)
                                    assert "set-cookie" not in answer.headers, (sent, query)
                                    assert "master-replica" not in answer.text
                                    assert "csrf" not in answer.text
        # a wrong ?token= is refused as no token is: no redirect, no cookie
        for query in (f"?token={wrong}", f"?token={token}x", "?token="):
            answer = client.get("/jobs/fake01" + query, headers={"Host": here})
            assert answer.status_code == 403 and "set-cookie" not in answer.headers
            assert "needs its token" in answer.text
        # the same requests with the token pass: what refused them was the token alone
        assert client.get("/jobs/fake01", headers={
            "Host": here, "Authorization": f"token {token}"}).status_code == 200
        assert client.get(f"/jobs/fake01?token={token}",
                          headers={"Host": here}).status_code == 303
    assert records.load("fake01").state == records.RUNNING


@pytest.mark.parametrize("given", [" *", "*\t", "jobs.example.org, *", "\u3000*,",
                                   "jobs.example.org,*, ", "[*]"])
def test_a_star_with_space_is_still_a_star_and_needs_a_token(given):
    out = subprocess.run([sys.executable, "-m", "submit", "console", "--port", "0",
                          "--allowed-hosts", given], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1
    assert "--allowed-hosts '*' on a loopback address needs a token" in out.stderr


def test_allowed_hosts_are_parsed_once_as_used():
    assert guard.parse_hosts(" Jobs.Example.ORG ,\t*\t,,[::1], 10.0.0.5\n") == (
        "jobs.example.org", "*", "::1", "10.0.0.5")
    assert guard.allowed_hosts("127.0.0.1", "jobs.example.org, *") is None
    hosts = guard.allowed_hosts("127.0.0.1", " Jobs.Example.org ,")
    assert hosts is not None and "jobs.example.org" in hosts and "" not in hosts
    for bad in ("*.example.org", "jobs example.org", "evil/x", "a\x00b"):
        with pytest.raises(UsageError, match="is not a host name"):
            guard.parse_hosts(bad)


def _labelled(tmp_path, count=40):
    """Jobs whose label is the string every attack backtracks on."""
    for i in range(count):
        records.save(records.JobRecord(f"redos{i:02d}", state=records.SUCCEEDED,
                                       labels={"k": "a" * 60 + "b"}))
    stored_job(tmp_path)


def test_filters_that_froze_the_console_answer_at_once(tmp_path, reaper):
    _labelled(tmp_path)
    log = tmp_path / "console.log"
    url = start_console(reaper, log)
    proc = reaper.procs[-1]
    with httpx.Client(base_url=url, timeout=60) as client:
        for attack in ATTACKS:
            started = time.monotonic()
            answer = client.get("/rows", params={"filter": attack})
            # each took 60 s or more before (Python's re); a generous bound, not a timing
            assert time.monotonic() - started < 5, attack
            assert answer.status_code == 200 and "no jobs" in answer.text
        # a filter that matches, through the same engine
        found = client.get("/rows", params={"filter": "labels.k~'^a+b$'"})
        assert found.text.count("data-job=") == 40
        # the same requests from another site's page: refused, nothing run
        for sent in ({"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                     {"Origin": "http://evil.example"}, {"Origin": "http://127.0.0.1:1"}):
            answer = client.get("/rows", params={"filter": ATTACKS[0]}, headers=sent)
            assert answer.status_code == 403 and "data-job=" not in answer.text, sent
            answer = client.get("/", params={"filter": ATTACKS[0]}, headers=sent)
            assert answer.status_code == 403
            assert "only from the console&#x27;s own pages" in answer.text
        # its own pages and the address bar: taken
        for sent in ({"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"},
                     {"Origin": url}):
            assert client.get("/rows", params={"filter": "state=RUNNING"},
                              headers=sent).text.count("data-job=") == 1
        # mistakes past the parser's bounds: one line, 400
        for text in ("(" * 1000 + "state=RUNNING" + ")" * 1000, "NOT " * 1000 + "jobId:*",
                     "jobId~a{4294967296}", "jobId~'(?=a)'"):
            answer = client.get("/", params={"filter": text})
            assert answer.status_code == 400, text
            error = re.search(r"<p class=error role=alert>(.*?)</p>", answer.text)[1]
            assert "\n" not in error and "Traceback" not in answer.text
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) in (0, -signal.SIGTERM)  # uvicorn re-raises it


def test_a_slow_filter_runs_off_the_event_loop(tmp_path, reaper):
    """Many jobs and a filter over all of them: the console answers a page meanwhile, and
    SIGTERM stops it while the filter runs."""
    _labelled(tmp_path, 400)
    url = start_console(reaper, tmp_path / "console.log")
    proc = reaper.procs[-1]
    heavy = " OR ".join(f"labels.k~'^((a+))+{i}$'" for i in range(60))
    results: list = []

    def filtering():
        with httpx.Client(base_url=url, timeout=60) as client:
            for _ in range(20):
                try:
                    results.append(client.get("/rows", params={"filter": heavy}).status_code)
                except httpx.HTTPError:
                    return
    worker = threading.Thread(target=filtering)
    worker.start()
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            while not results:
                time.sleep(0.05)
            for _ in range(5):
                assert client.get("/jobs/fake01").status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)  # uvicorn re-raises it
        worker.join(timeout=60)
    assert results and set(results) == {200}


def test_the_filter_is_read_off_the_event_loop(tmp_path, monkeypatch):
    """A filter that takes long (here: one held until another page was answered) leaves
    the event loop free: were it run on the loop, the other page would never come."""
    import asyncio

    from submit.query import listing
    from submit.console.app import Console
    stored_job(tmp_path)
    answered = threading.Event()
    select = listing.select

    def slow_select(*args, **kwargs):
        assert answered.wait(30), "the job page was not answered while the filter ran"
        return select(*args, **kwargs)
    monkeypatch.setattr(listing, "select", slow_select)

    async def both():
        transport = httpx.ASGITransport(app=Console("127.0.0.1", 8080))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8080",
                                     timeout=60) as client:
            async def page():
                answer = await client.get("/jobs/fake01/live")
                answered.set()
                return answer
            return await asyncio.gather(client.get("/rows", params={"filter": "jobId:*"}),
                                        page())
    rows, live = asyncio.run(asyncio.wait_for(both(), 60))
    assert live.status_code == 200 and rows.status_code == 200
    assert 'data-job="fake01"' in rows.text
