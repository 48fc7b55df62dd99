"""The console's web application (Starlette): pages from the job index, logs as
server-sent events, a job's training curves from its summaries, cancel as a POST.

Everything it shows comes from what the CLI reads: the index (`submit.jobs`), the filter
of `jobs list` (`submit.query.listing`), the job life's `refresh` and `cancel`
(`submit.lifecycle`) on each runner (`submit.submission.runner_for`), a runner's `logs`,
and the local runner's log follower (`submit.logs`).

A filter (`?filter=`, `jobs list`'s language: RE2 patterns, linear in time) is read in a
worker thread, never on the event loop, and only from the console's own pages or an
address the user opened: a request another site or another port sent (`Sec-Fetch-Site`
cross-site or same-site, or an `Origin` that is not the console's) gets the list
without running it, 403, so no page elsewhere can spend the console's CPU.

Only this console's own pages can cancel a job: a POST must carry the token its job page
was rendered with (made fresh each time the console starts, compared in constant time)
and an Origin (or, without one, a Referer) naming the console itself, and a body of at
most MAX_FORM_BYTES (refused before it is read). Every request first passes the Host
check and, when the console has one, the token (`guard.py`). Pages may not be framed,
and load scripts and styles only from the console.
"""
from __future__ import annotations

import asyncio
import hmac
import secrets
import threading
from collections.abc import Iterator, Sequence
from urllib.parse import parse_qs, urlsplit

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from mljob.errors import ascii_digits, first_line
from submit import job_index, jobs, lifecycle, logs
from submit.query import curves, listing
from submit.console import assets, guard, pages
from submit.errors import JobNotFoundError, SubmitError, UsageError
from submit.submission import runner_for

KEEPALIVE_S = 15.0
QUEUE_BYTES = 1 << 20  # of log lines read ahead of what the browser has taken
TAIL_BYTES = 4 << 20   # a longer log is shown from its last 4 MiB (a seek)
MAX_FORM_BYTES = 4096
HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                                      "frame-ancestors 'none'; form-action 'self'; "
                                      "base-uri 'self'",
           "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "same-origin", "Cache-Control": "no-store"}


def _html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers=HEADERS)


class Console:
    """The application, bound to the host and port it serves (for the Host check), with
    the access token it asks for (None: none asked, on loopback only)."""

    def __init__(self, host: str, port: int, access_token: str | None = None,
                 allowed_hosts: str | Sequence[str] | None = None):
        self.token = secrets.token_urlsafe(32)  # the cancel form's
        # where each log stream's files began (a big log from its tail), so that a
        # browser that reconnects with Last-Event-ID gets the same numbering
        self.tails: dict[tuple[str, str | None], dict[str, int]] = {}
        self.guard = guard.Guard(guard.allowed_hosts(host, allowed_hosts), access_token,
                                 port)
        self.app = Starlette(routes=[
            Route("/", self.jobs_list), Route("/rows", self.rows),
            Route("/jobs/{job_id}", self.job), Route("/jobs/{job_id}/live", self.live),
            Route("/jobs/{job_id}/curves", self.curves),
            Route("/jobs/{job_id}/logs", self.logs),
            Route("/jobs/{job_id}/cancel", self.cancel, methods=["POST"]),
            Route("/static/console.css", lambda _: Response(
                assets.CSS, media_type="text/css", headers=HEADERS)),
            Route("/static/console.js", lambda _: Response(
                assets.JS, media_type="text/javascript", headers=HEADERS))])

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            refusal = self.guard.check(scope)
            if refusal is not None:
                return await refusal(scope, receive, send)
        return await self.app(scope, receive, send)

    # --- pages -----------------------------------------------------------------------

    async def _select(self, request: Request
                      ) -> tuple[list[jobs.JobRecord], str, str | None, int]:
        """(jobs, filter, error, status): the filter runs in a worker thread, and only
        for a request of the console's own pages or the user's own address bar."""
        text = request.query_params.get("filter", "")
        if text and _from_elsewhere(request):
            return [], text, ("a filter is taken only from the console's own pages: this "
                              "request came from another site or port; open the console's "
                              "address and filter there"), 403
        try:
            # The index's summary (submit.job_index), as `jobs list` reads it: no record
            # file is opened again unless it changed.
            return (await run_in_threadpool(
                lambda: listing.select(job_index.summaries(), filter_text=text or None)),
                text, None, 200)
        except UsageError as exc:
            return [], text, str(exc), 400

    async def jobs_list(self, request: Request) -> Response:
        chosen, text, error, status = await self._select(request)
        return _html(pages.list_page(chosen, text, error, _root(request)), status)

    async def rows(self, request: Request) -> Response:
        chosen, _, error, status = await self._select(request)
        return _html(pages.jobs_rows(chosen), status)

    async def _record(self, job_id: str) -> tuple[jobs.JobRecord, str | None]:
        """The job's record, refreshed by its runner (an engine is asked for its status);
        a runner that cannot answer leaves the record as the index has it, with why."""
        record = jobs.load(job_id)
        try:
            return await run_in_threadpool(lifecycle.refresh, runner_for(record), record), None
        except Exception as exc:  # an engine's SDK or API: show the index's copy
            return record, f"cannot ask the {record.runner} runner: {first_line(exc)}"

    async def job(self, request: Request) -> Response:
        try:
            record, note = await self._record(request.path_params["job_id"])
        except SubmitError as exc:
            return _not_found(exc, _root(request))
        return _html(pages.job_page(record, self.token, note,
                                    await run_in_threadpool(_curves, record),
                                    _root(request)))

    async def curves(self, request: Request) -> Response:
        """The curves part of the job page, which the page polls while the job runs."""
        try:
            record = jobs.load(request.path_params["job_id"])
        except SubmitError as exc:
            return _not_found(exc)
        return _html(await run_in_threadpool(_curves, record) or
                     "<p class=note id=curves-note>this job writes no training curves</p>")

    async def live(self, request: Request) -> Response:
        try:
            record, note = await self._record(request.path_params["job_id"])
        except SubmitError as exc:
            return _not_found(exc)
        return _html(pages.live(record, note))

    # --- logs ------------------------------------------------------------------------

    async def logs(self, request: Request) -> Response:
        try:
            record = jobs.load(request.path_params["job_id"])
        except SubmitError as exc:
            return _not_found(exc)
        task = request.query_params.get("task") or None
        labels = [r.label for r in record.replicas]
        if task is not None and task not in labels:
            return Response(f"task {task[:60]!r} names no replica of job {record.job_id}; "
                            f"use one of {', '.join(labels) or 'its replicas'}",
                            status_code=400, media_type="text/plain")
        resume = request.headers.get("last-event-id", "")
        # anything but a short ASCII number (`²`, `-1`, `1e3`) streams from the start
        skip = int(resume) if ascii_digits(resume) and len(resume) < 12 else 0
        if len(self.tails) > 10_000:  # where each stream's files began: kept small
            self.tails.clear()
        starts = self.tails.setdefault((record.job_id, task), {})
        return StreamingResponse(self._events(record, task, skip, starts),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store",
                                          "X-Accel-Buffering": "no"})

    async def _events(self, record: jobs.JobRecord, task: str | None, skip: int,
                      starts: dict[str, int]):
        """Each log line as an event numbered from 1 (a reconnecting browser sends the
        last number it saw), `note` events for a runner's error, and `end` with the
        job's final state. The reading thread stops when the browser goes away, and
        waits while QUEUE_BYTES of lines are not yet sent (a slow browser and a 400 MB
        log never put the log in memory)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        stop = threading.Event()
        room = threading.Condition()
        pending = [0]  # bytes of lines queued and not yet sent

        def put(item) -> bool:
            """Queue item once there is room; False once the browser has gone."""
            with room:
                while pending[0] > QUEUE_BYTES and not stop.is_set():
                    room.wait(0.5)
                if stop.is_set():
                    return False
                pending[0] += len(item[1] or "")
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is closed
                return False
            return True

        def read() -> None:
            try:
                for line in _lines(record, task, stop, starts):
                    if not put(("line", line)):
                        return
            except Exception as exc:  # a runner that cannot read logs: say why
                put(("note", f"cannot read the logs: {first_line(exc)}"))
            put(("end", None))

        threading.Thread(target=read, daemon=True, name="console-logs").start()
        count = 0
        try:
            while True:
                try:
                    kind, value = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
                except TimeoutError:
                    yield ": keep-alive\n\n"
                    continue
                if kind == "line":
                    count += 1
                    if count > skip:
                        yield f"id: {count}\ndata: {_one_line(value)}\n\n"
                    with room:  # sent: room for as much more
                        pending[0] -= len(value)
                        room.notify()
                elif kind == "note":
                    yield f"event: note\ndata: {_one_line(value)}\n\n"
                else:
                    state = await run_in_threadpool(_final_state, record.job_id)
                    yield f"event: end\ndata: {state}\n\n"
                    return
        finally:
            stop.set()
            with room:
                room.notify_all()

    # --- cancel ----------------------------------------------------------------------

    async def cancel(self, request: Request) -> Response:
        root = _root(request)
        host = request.headers.get("host", "")
        origin = request.headers.get("origin")
        if origin is None and request.headers.get("referer"):
            parts = urlsplit(request.headers["referer"])
            origin = f"{parts.scheme}://{parts.netloc}"
        if not origin or origin != f"{request.url.scheme}://{host}":
            return _html(pages.message_page(
                "Refused", "a cancel must come from this console's own page (the request "
                           f"came from {origin or 'an unknown origin'})", root), 403)
        body = await _form_body(request)
        if body is None:
            return _html(pages.message_page(
                "Refused", f"a cancel form is at most {MAX_FORM_BYTES} bytes", root), 413)
        fields = parse_qs(body.decode("utf-8", "replace"))
        token = (fields.get("csrf") or [""])[0]
        if not hmac.compare_digest(token.encode(), self.token.encode()):
            return _html(pages.message_page(
                "Refused", "the form's token is missing or stale; reload the job page "
                           "and cancel from there", root), 403)
        try:
            record = jobs.load(request.path_params["job_id"])
            await run_in_threadpool(lifecycle.cancel, runner_for(record), record)
        except JobNotFoundError as exc:
            return _not_found(exc, root)
        except SubmitError as exc:  # already ended, or the runner refused
            return _html(pages.message_page("Cannot cancel", str(exc), root), 409)
        return RedirectResponse(f"{root}/jobs/{record.job_id}", status_code=303)


async def _form_body(request: Request) -> bytes | None:
    """The body, or None when it is larger than MAX_FORM_BYTES: a declared length is
    refused before anything is read, a chunked body once it passes the limit."""
    declared = request.headers.get("content-length", "")
    if declared and not (declared.isascii() and declared.isdecimal()
                         and len(declared) <= 12 and int(declared) <= MAX_FORM_BYTES):
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return None
    return bytes(body)


def _lines(record: jobs.JobRecord, task: str | None, stop: threading.Event,
           starts: dict[str, int]) -> Iterator[str]:
    """The job's log lines until it ends (or the browser leaves): a local job's files
    through the follower `jobs stream-logs` uses (each from its last TAIL_BYTES, where
    `starts` says), an engine's through its runner."""
    if record.runner == "local" and record.log_dir:
        job_id = record.job_id

        def done() -> bool:
            if stop.is_set():
                return True
            current = jobs.load(job_id)
            return current.done or not current.supervisor_alive()

        return logs.follow(jobs.own_log_dir(record), task_name=task, done=done,
                           tail_bytes=TAIL_BYTES, starts=starts)
    return runner_for(record).logs(record.engine, task_name=task, follow=True)


def _curves(record: jobs.JobRecord) -> str:
    """The job's curves part; "" for a job that has none to show (no job dir; a tuning
    job, whose trials have their own dirs and the trials' plots)."""
    if not record.job_dir or (record.training_input or {}).get("hyperparameters"):
        return ""
    try:
        return pages.curves_section(curves.of_job(record.job_id, record.job_dir))
    except curves.MissingReader as exc:
        return pages.curves_section({}, str(exc))
    except OSError as exc:  # storage: a bucket without access, a bad URL
        return pages.curves_section({}, f"cannot read the summaries: {first_line(exc)}")


def _final_state(job_id: str) -> str:
    try:
        return pages.state_of(jobs.load(job_id))
    except SubmitError:
        return "UNKNOWN"


def _one_line(text: str) -> str:
    return text.replace("\r", " ").replace("\n", " ")


def _not_found(exc: SubmitError, root: str = "") -> Response:
    """404 for an id the index does not hold; 422 for a record it holds damaged."""
    if isinstance(exc, (JobNotFoundError, UsageError)):
        return _html(pages.message_page("No such job", str(exc), root), 404)
    return _html(pages.message_page("Damaged job record", str(exc), root), 422)


def _root(request: Request) -> str:
    """The path the console's pages live under: a token console's own (`guard.py`)."""
    return str(request.scope.get("root_path") or "")


def _from_elsewhere(request: Request) -> bool:
    """Whether a browser says another site or another port of this host sent the request
    (a typed address or bookmark is `none`; the console's own pages `same-origin`)."""
    if request.headers.get("sec-fetch-site", "").lower() in ("cross-site", "same-site"):
        return True
    origin = request.headers.get("origin")
    return origin is not None and origin != f"{request.url.scheme}://" \
        f"{request.headers.get('host', '')}"
