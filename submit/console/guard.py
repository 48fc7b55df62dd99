"""Who may talk to the console: the Host check (DNS rebinding) and the token a console
reachable from the network asks for, as Jupyter's server does for the same threats.

- Every request's `Host` must name this console: a loopback name, the address it is
  bound to (on `0.0.0.0` or `::`, this machine's host names and interface addresses),
  or a name given with `--allowed-hosts` (`*` takes any). A page of another site whose
  name resolves to this machine sends its own name and gets 421.
- A console bound to anything but loopback needs a token (printed once with its URL,
  read from `--token-file`, or given with `--token`); a loopback console needs one only
  when given one. It is taken from `?token=` (then kept in a same-site, HTTP-only
  cookie of this port, and the address shown without it), from `Authorization: token
  T` (or `Bearer T`), or from that cookie; compared in constant time. Without it: 403.
"""
from __future__ import annotations

import hmac
import ipaddress
import secrets
import socket
from urllib.parse import parse_qsl, urlencode

from starlette.responses import RedirectResponse, Response

from submit.errors import UsageError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
MIN_TOKEN = 16


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(token: str | None, token_file: str | None) -> str | None:
    """The token given (`--token` or `--token-file`), checked; None when none is."""
    if token is not None and token_file is not None:
        raise UsageError("--token and --token-file both given; use one")
    source = "--token"
    if token_file is not None:
        source = f"--token-file {token_file}"
        try:
            with open(token_file, "rb") as f:
                raw = f.read(4097)
        except OSError as exc:
            raise UsageError(f"{source} cannot be read ({exc.strerror}); name a file "
                             "holding the token") from None
        if len(raw) > 4096:
            raise UsageError(f"{source} is longer than 4096 bytes; it must hold the "
                             "token alone")
        token = raw.decode("ascii", "replace").strip()
    if token is None:
        return None
    if not (len(token) >= MIN_TOKEN and token.isascii() and token.isprintable()
            and " " not in token):
        raise UsageError(f"{source}: a token must be at least {MIN_TOKEN} printable ASCII "
                         "characters without spaces; make one with `python3 -c \"import "
                         "secrets; print(secrets.token_urlsafe(32))\"`")
    return token


def allowed_hosts(host: str, extra: str | None) -> frozenset[str] | None:
    """The names a request's Host may carry (without the port); None takes any."""
    names = set(LOOPBACK_NAMES)
    if host in ("0.0.0.0", "::", ""):
        names |= _this_machine()
    else:
        names.add(host.lower())
    for name in (extra or "").split(","):
        name = name.strip().lower()
        if name == "*":
            return None
        if name:
            names.add(name.strip("[]"))
    return frozenset(names)


def _this_machine() -> set[str]:
    names = {socket.gethostname().lower(), socket.getfqdn().lower()}
    try:
        import psutil
        for addresses in psutil.net_if_addrs().values():
            names.update(a.address.split("%")[0].lower() for a in addresses
                         if a.family in (socket.AF_INET, socket.AF_INET6))
    except Exception:  # psutil missing or the interfaces unreadable: names only
        pass
    return names


def host_name(header: str) -> str:
    """`Host: name:port` or `[::1]:port` -> the name, lower-case."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guard:
    """The Host check and the token, before any route runs."""

    def __init__(self, hosts: frozenset[str] | None, token: str | None, port: int):
        self.hosts = hosts
        self.token = token
        self.cookie = f"mljob-console-{port}"

    def check(self, scope) -> Response | None:
        """None when the request may go on, else the answer that refuses it."""
        headers = dict(scope["headers"])
        host = headers.get(b"host", b"").decode("latin-1")
        if self.hosts is not None and host_name(host) not in self.hosts:
            return Response(f"refused: Host {host[:80]!r} is not this console; open it at "
                            "the address it printed (or add the name with --allowed-hosts)",
                            status_code=421, media_type="text/plain")
        if self.token is None or scope["path"].startswith("/static/"):
            return None
        query = scope.get("query_string", b"").decode("latin-1")
        pairs = parse_qsl(query, keep_blank_values=True)
        given = [v for k, v in pairs if k == "token"]
        if given and self._same(given[-1]):
            # keep it in a cookie and take it out of the address bar (and of Referers)
            rest = urlencode([(k, v) for k, v in pairs if k != "token"])
            answer = RedirectResponse(scope["path"] + (f"?{rest}" if rest else ""), 303)
            answer.set_cookie(self.cookie, self.token, httponly=True, samesite="strict",
                              path="/")
            return answer
        auth = headers.get(b"authorization", b"").decode("latin-1").split(None, 1)
        if len(auth) == 2 and auth[0].lower() in ("token", "bearer") and \
                self._same(auth[1].strip()):
            return None
        if self._same(_cookie(headers.get(b"cookie", b"").decode("latin-1"), self.cookie)):
            return None
        return Response("refused: this console needs its token; open the address it "
                        "printed (…/?token=…) or send 'Authorization: token …'",
                        status_code=403, media_type="text/plain")

    def _same(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(
            given.encode("utf-8", "replace"), self.token.encode())


def _cookie(header: str, name: str) -> str:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return ""


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_for(host: str, given: str | None) -> tuple[str | None, bool]:
    """The token this console asks for and whether it was made here (to be printed):
    one is made for a console bound to anything but loopback."""
    if given is not None:
        return given, False
    if is_loopback(host):
        return None, False
    return new_token(), True
