"""`python -m submit console`: the jobs of the local index in a browser.

A jobs list (state, labels, created, duration, runner; `jobs list`'s filter), and a page
per job: its replicas (state, restarts, exit statuses, CPU and memory), logs that follow
live with a replica picker, a tuning job's trials with plots of the objective per trial
and per parameter, a batch prediction's progress, the TensorBoard command, and cancel.
Pages are rendered on the server (`pages.py`, charts in `svg.py`), with a little script
that refreshes them; the application is `app.py`. It listens on 127.0.0.1 unless told;
who may talk to it (the Host check, the token off loopback) is `guard.py`.
"""
from __future__ import annotations

import socket

from submit.errors import UsageError

DEFAULT_PORT = 8080


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, or a one-line error naming the fix."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OverflowError:
        sock.close()
        raise UsageError(f"--port {port} is not a port; use 1-65535 (0 picks a free one)") \
            from None
    except OSError as exc:
        sock.close()
        why = "is in use" if exc.errno == 98 else f"cannot be used ({exc.strerror})"
        raise UsageError(f"{host}:{port} {why}; pick another with --port (or --host)") \
            from None
    sock.listen(128)
    return sock


def serve(host: str, port: int, echo, token: str | None = None,
          token_file: str | None = None, allowed_hosts: str | None = None) -> int:
    """Serve until Ctrl-C or SIGTERM; the exit status."""
    import uvicorn

    from submit.console import guard
    from submit.console.app import Console
    access, made = guard.token_for(host, guard.read_token(token, token_file))
    names = guard.parse_hosts(allowed_hosts)  # once: what is checked is what is used
    if access is None and "*" in names:
        raise UsageError("--allowed-hosts '*' on a loopback address needs a token (give "
                         "--token-file): any web site's name could reach the console")
    sock = bind(host, port)
    port = sock.getsockname()[1]
    shown = socket.gethostname() if host in ("0.0.0.0", "::") else host
    shown = f"[{shown}]" if ":" in shown else shown
    # a token made here is printed once, in the address; a given one is not repeated
    query = f"?token={access}" if made else ""
    how = " (with the token given)" if access and not made else ""
    echo(f"mljob console on http://{shown}:{port}/{query}{how} (Ctrl-C stops it)")
    config = uvicorn.Config(Console(host, port, access, names), log_level="warning",
                            lifespan="off", timeout_graceful_shutdown=2)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
    return 0
