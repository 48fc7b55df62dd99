"""Who may talk to the console: the Host check (DNS rebinding) and the token a console
reachable from the network asks for, as Jupyter's server does for the same threats.

- Every request's `Host` must name this console: a loopback name, the address it is
  bound to (on `0.0.0.0` or `::`, this machine's host names and interface addresses),
  or a name given with `--allowed-hosts` (`*` takes any). A page of another site whose
  name resolves to this machine sends its own name and gets 421.
  `--allowed-hosts` is parsed once (`parse_hosts`): each name stripped of whitespace,
  lower-cased, empties dropped; whether `*` is among them is decided on that list.
- A console bound to anything but loopback needs a token (printed once with its URL,
  read from `--token-file`, or given with `--token`); a loopback console needs one only
  when given one. It is taken from `Authorization: token T` (or `Bearer T`), or from
  `?token=`, compared in constant time. A right `?token=` answers with a redirect into
  the console's own path, `/console/KEY/` (KEY derived from the token and the port:
  nobody without the token can name it), and a cookie scoped to that path alone
  (`HttpOnly`, `SameSite=Strict`), whose value is derived from the token too. Browsers
  send a host's cookies to every port of the host, for every path the cookie's Path
  covers: scoped to a path only this console's pages use, it reaches no other local
  service (docs/console.md says what this protects against). Without the token: 403;
  a wrong `?token=` is refused as no token is, and sets nothing.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import re
import secrets
import socket
from collections.abc import Sequence
from urllib.parse import parse_qsl, urlencode

from starlette.responses import RedirectResponse, Response

from submit.errors import UsageError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
MIN_TOKEN = 16
ROOT = "/console/"  # a token console's pages live under ROOT + KEY
_HOST_NAME = re.compile(r"[a-z0-9._:-]+")


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


def parse_hosts(text: str | None) -> tuple[str, ...]:
    """`--allowed-hosts` as it is used: comma-separated names, each stripped of white
    space (and of an IPv6 address's brackets) and lower-cased, empty ones dropped; `*`
    alone takes any name. A one-line error for anything that is no host name."""
    names = []
    for item in (text or "").split(","):
        name = item.strip().lower()
        if name.startswith("[") and name.endswith("]"):
            name = name[1:-1].strip()
        if not name:
            continue
        if name != "*" and not _HOST_NAME.fullmatch(name):
            raise UsageError(f"--allowed-hosts: {name!r:.80} is not a host name; give "
                             "comma-separated names (e.g. jobs.example.org,10.0.0.5), or "
                             "'*' alone for any name")
        names.append(name)
    return tuple(names)


def allowed_hosts(host: str, extra: str | Sequence[str] | None) -> frozenset[str] | None:
    """The names a request's Host may carry (without the port); None takes any.
    `extra`: `parse_hosts`'s names (a text is parsed by it)."""
    given = parse_hosts(extra) if isinstance(extra, str) or extra is None else tuple(extra)
    if "*" in given:
        return None
    names = set(LOOPBACK_NAMES)
    if host in ("0.0.0.0", "::", ""):
        names |= _this_machine()
    else:
        names.add(host.lower())
    return frozenset(names | set(given))


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


def _derived(token: str, purpose: str, port: int) -> str:
    digest = hmac.new(token.encode(), f"mljob-console {purpose} {port}".encode(),
                      hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest[:24]).decode().rstrip("=")


class Guard:
    """The Host check and the token, before any route runs."""

    def __init__(self, hosts: frozenset[str] | None, token: str | None, port: int):
        self.hosts = hosts
        self.token = token
        self.cookie = f"mljob-console-{port}"
        # where a browser holding the token is sent, and the only path its cookie covers
        self.root = ROOT + _derived(token, "path", port) if token else ""
        self.cookie_value = _derived(token, "cookie", port) if token else ""

    def check(self, scope) -> Response | None:
        """None when the request may go on, else the answer that refuses it. A request
        under the console's own path has it as its `root_path` (the routes see the rest)."""
        headers = dict(scope["headers"])
        host = headers.get(b"host", b"").decode("latin-1")
        if self.hosts is not None and host_name(host) not in self.hosts:
            return Response(f"refused: Host {host[:80]!r} is not this console; open it at "
                            "the address it printed (or add the name with --allowed-hosts)",
                            status_code=421, media_type="text/plain")
        if self.token is None:
            return None
        path = scope["path"]
        inside = path == self.root or path.startswith(self.root + "/")
        if inside:
            scope["root_path"] = self.root
        if path == self.root:  # the pages' links are relative to ROOT/KEY/
            return RedirectResponse(self.root + "/", 303)
        if (path[len(self.root):] if inside else path).startswith("/static/"):
            return None
        query = scope.get("query_string", b"").decode("latin-1")
        pairs = parse_qsl(query, keep_blank_values=True)
        given = [v for k, v in pairs if k == "token"]
        if given and self._same(given[-1]):
            # into the console's own path, with the cookie that path alone receives, and
            # the token out of the address bar (and of Referers)
            rest = urlencode([(k, v) for k, v in pairs if k != "token"])
            where = self.root + (path[len(self.root):] if inside else path)
            answer = RedirectResponse(where + (f"?{rest}" if rest else ""), 303)
            answer.set_cookie(self.cookie, self.cookie_value, httponly=True,
                              samesite="strict", path=self.root)
            return answer
        auth = headers.get(b"authorization", b"").decode("latin-1").split(None, 1)
        if len(auth) == 2 and auth[0].lower() in ("token", "bearer") and \
                self._same(auth[1].strip()):
            return None
        if inside and hmac.compare_digest(
                _cookie(headers.get(b"cookie", b"").decode("latin-1"),
                        self.cookie).encode("utf-8", "replace"), self.cookie_value.encode()):
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
