"""Why talking to NATS failed, in one line that names the cause and the option that fixes it.

nats-py reports the causes poorly: a refused login and an unreachable server both end as
"no servers available" (the cause goes only to the error callback); a certificate the client
does not trust hangs the connect for good (nats-io/nats.py#718); and the server refuses a
publish or subscription asynchronously, through the error callback, so a request to a denied
subject just times out. `ErrorWatch` is that error callback: it keeps the cause, ends a
connect that cannot succeed at once, and fails the work waiting on a denied subject.

Nothing here imports nats (`loom sim` loads the CLI, which catches `NatsProblem`, without it).
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from schemas.subjects import STREAM
from services.runtime.nats_auth import NatsAuth

T = TypeVar("T")
ErrorCallback = Callable[[Exception], Awaitable[None]]

# The server's words (nats-server's -ERR lines, as nats-py words them).
_PERMISSION = re.compile(r"permissions violation for (publish|subscription) to \"?([^\"']+)",
                         re.IGNORECASE)
# The leading words of NATS system subjects ($JS.API..., $JS.ACK, $SRV, _INBOX).
_SYSTEM_WORDS = frozenset({
    "$js", "$srv", "$kv", "$sys", "_inbox", "api", "ack", "fc", "info", "stream", "consumer",
    "create", "durable", "delete", "update", "purge", "names", "list", "msg", "next", "get",
    "direct", "leader", "stepdown", "ping", "stats"})
_AUTHORIZATION = ("authorization violation", "authorization failed",
                  "authentication expired", "authentication revoked",
                  "invalid user credentials")


class NatsProblem(RuntimeError):
    """A NATS connection or operation failed for a cause a person can fix; the message says
    which, in one line."""


class NatsAuthorizationError(NatsProblem):
    """The server refused the login (wrong or missing password, credentials or nkey)."""


class NatsPermissionError(NatsProblem):
    """The server refused a publish or subscription of this identity."""

    def __init__(self, message: str, action: str, subject: str) -> None:
        super().__init__(message)
        self.action = action  # "publish" or "subscribe"
        self.subject = subject


class NatsNoServerError(NatsProblem):
    """Nothing (that speaks NATS) answered at the URL."""


class NatsNoStreamError(NatsProblem):
    """The server is up, but no stream stores the subject (the cluster's services have not
    created it yet, or this is not a Loom cluster's server)."""


class NatsTlsError(NatsProblem):
    """The TLS handshake failed: an untrusted or mismatched certificate, or none given."""


def who(auth: NatsAuth) -> str:
    """The identity a connection presents, for messages (never the secret)."""
    if auth.user is not None:
        return f'user "{auth.user}"'
    if auth.creds is not None:
        return f"the credentials file {auth.creds}"
    if auth.nkey is not None:
        return f"the nkey seed {auth.nkey}"
    return "a client without credentials"


def is_authorization(exc: BaseException) -> bool:
    return type(exc).__name__ in ("AuthorizationError", "InvalidUserCredentialsError") or any(
        word in str(exc).lower() for word in _AUTHORIZATION)


def is_tls(exc: BaseException) -> bool:
    return isinstance(exc, ssl.SSLError)


def permission(exc: BaseException) -> tuple[str, str] | None:
    """("publish" | "subscribe", subject) of a permissions violation, else None."""
    found = _PERMISSION.search(str(exc))
    if found is None:
        return None
    action = "publish" if found.group(1).lower() == "publish" else "subscribe"
    return action, restore_case(found.group(2))


def restore_case(subject: str) -> str:
    """nats-py lower-cases the server's error line, subject included. Loom's own subjects
    are lower case; a system subject starts with upper-case words ($JS.API.CONSUMER.CREATE,
    _INBOX) and the stream's name (LOOM), which are restored. What follows them (a consumer
    name, a filter subject, an inbox id) is left as reported."""
    tokens = subject.split(".")
    lead = 0
    while lead < len(tokens) and tokens[lead] in _SYSTEM_WORDS:
        lead += 1
    if lead and lead < len(tokens) and tokens[lead] == STREAM.lower():
        lead += 1
    return ".".join([t.upper() for t in tokens[:lead]] + tokens[lead:])


def authorization_error(url: str, auth: NatsAuth) -> NatsAuthorizationError:
    if auth.user is not None and auth.password is None:
        hint = "no password given (--nats-password or LOOM_NATS_PASSWORD)"
    elif auth.user is not None:
        hint = "wrong password, or no such user (--nats-user, LOOM_NATS_PASSWORD)"
    elif auth.creds is not None or auth.nkey is not None:
        hint = "unknown, expired or unreadable key (--nats-creds, --nats-nkey)"
    else:
        return NatsAuthorizationError(
            f"authorization violation at {url}: the server requires a login and none was "
            "given (--nats-user with LOOM_NATS_PASSWORD, --nats-creds or --nats-nkey)")
    return NatsAuthorizationError(
        f"authorization violation at {url}: the server refused {who(auth)}: {hint}")


def permission_error(url: str, auth: NatsAuth, action: str, subject: str) -> NatsPermissionError:
    return NatsPermissionError(
        f'permission denied at {url}: {who(auth)} may not {action} to "{subject}" '
        "(deploy/nats/accounts.conf lists what each user may publish and subscribe to)",
        action, subject)


def tls_error(url: str, exc: ssl.SSLError) -> NatsTlsError:
    reason = str(getattr(exc, "reason", None) or exc)
    if isinstance(exc, ssl.SSLCertVerificationError):
        detail = exc.verify_message or reason
        if "hostname" in detail.lower() or "ip address mismatch" in detail.lower():
            why = f"the server's certificate is not for this address ({detail})"
        else:
            why = (f"the server's certificate is not trusted ({detail}): give the CA that "
                   "signed it with --nats-tls-ca or LOOM_NATS_CA")
    elif "CERTIFICATE_REQUIRED" in reason.upper():
        why = ("the server requires a client certificate: give --nats-tls-cert and "
               "--nats-tls-key (or LOOM_NATS_CERT, LOOM_NATS_KEY)")
    elif "ALERT" in reason.upper():
        why = (f"the server refused the handshake ({reason.lower()}): check the client "
               "certificate (--nats-tls-cert, --nats-tls-key) against the server's CA")
    else:
        why = f"handshake failed ({reason})"
    return NatsTlsError(f"TLS failure with {url}: {why}")


def no_server_error(url: str, exc: BaseException | None) -> NatsNoServerError:
    if isinstance(exc, ConnectionRefusedError):
        why = "connection refused"
    elif isinstance(exc, socket.gaierror):
        why = f"cannot resolve the host name ({exc.strerror or exc})"
    elif isinstance(exc, TimeoutError):  # asyncio's and the socket's
        why = "no answer (timed out)"
    elif isinstance(exc, OSError) and exc.strerror:
        why = exc.strerror.lower()
    elif exc is not None:
        why = str(exc) or type(exc).__name__
    else:
        why = "no connection"
    return NatsNoServerError(f"no server at {url}: {why} (start one with `loom up`, or point "
                             "--nats-url or LOOM_NATS_URL at yours)")


def explain(url: str, auth: NatsAuth, exc: BaseException,
            seen: list[BaseException] | tuple[BaseException, ...] = ()) -> NatsProblem | None:
    """The cause of a failed connect: `exc` as raised, `seen` what the error callback heard
    (the most telling one wins: a refused login or TLS failure over an absent server)."""
    causes = [*seen, exc]
    for cause in causes:
        if is_authorization(cause):
            return authorization_error(url, auth)
    for cause in causes:
        if is_tls(cause):
            assert isinstance(cause, ssl.SSLError)
            return tls_error(url, cause)
    for cause in causes:
        if (denied := permission(cause)) is not None:
            return permission_error(url, auth, *denied)
    cut = [c for c in causes if is_cut_off(c)]
    if cut:
        return cut_off_error(url, auth, cut[-1])
    network = [c for c in causes if isinstance(c, OSError)]  # timeouts and refusals
    if network or type(exc).__name__ == "NoServersError":
        # What the last attempt heard: refused, unresolvable, silent, or not NATS at all.
        return no_server_error(url, network[-1] if network else (seen[-1] if seen else None))
    return None


def is_cut_off(exc: BaseException) -> bool:
    """The server hung up on a connection it had accepted."""
    return isinstance(exc, BrokenPipeError | ConnectionResetError) or \
        type(exc).__name__ == "UnexpectedEOF"


def cut_off_error(url: str, auth: NatsAuth, exc: BaseException) -> NatsProblem:
    """A server that hangs up during the connect. Over TLS that is its verdict on the client
    certificate: TLS 1.3 sends it after the client's side of the handshake is done, and
    whether the client reads the alert first or writes into the closed socket is a race."""
    tls = auth.tls_ca is not None or auth.tls_cert is not None or "tls://" in url
    why = (exc.strerror.lower() if isinstance(exc, OSError) and exc.strerror
           else str(exc) or type(exc).__name__)
    if tls and auth.tls_cert is None:
        return NatsTlsError(
            f"TLS failure with {url}: the server requires a client certificate: give "
            "--nats-tls-cert and --nats-tls-key (or LOOM_NATS_CERT, LOOM_NATS_KEY); it hung "
            f"up after the TLS handshake ({why})")
    if tls:
        return NatsTlsError(
            f"TLS failure with {url}: the server hung up after the handshake ({why}): check "
            "the client certificate (--nats-tls-cert, --nats-tls-key) against the server's CA")
    return NatsProblem(f"the server at {url} hung up during the connect ({why})")


class ErrorWatch:
    """The error callback of one connection (pass `on_error` as nats-py's `error_cb`).

    While connecting it keeps what went wrong, and ends the attempt at the first refused
    login or TLS failure (retrying cannot help; a certificate failure would hang). Once
    connected, a permissions violation fails the work `guard` runs; every error also goes to
    `then` (a service's logger), which during the connect hears nothing: the one error that
    ends it is raised instead.
    """

    def __init__(self, url: str, auth: NatsAuth | None = None,
                 then: ErrorCallback | None = None) -> None:
        self.url = url
        self.auth = auth or NatsAuth()
        self.then = then
        self.seen: list[BaseException] = []
        self.connected = False
        self._fatal: asyncio.Future[NatsProblem] | None = None
        self._denied: asyncio.Future[NatsPermissionError] | None = None

    async def on_error(self, exc: Exception) -> None:
        if not self.connected:
            self.seen = [*self.seen[-7:], exc]
            if is_authorization(exc) or is_tls(exc):
                self._end(explain(self.url, self.auth, exc))
            return
        denied = permission(exc)
        if denied is not None and self._denied is not None and not self._denied.done():
            self._denied.set_result(permission_error(self.url, self.auth, *denied))
        if self.then is not None:
            await self.then(exc)

    def _end(self, problem: NatsProblem | None) -> None:
        """Stop the connect attempt with `problem` (the first one counts)."""
        if problem is not None and self._fatal is not None and not self._fatal.done():
            self._fatal.set_result(problem)

    async def connect(self, start: Callable[[ErrorCallback], Awaitable[T]]) -> T:
        """`start(self.on_error)` (a `nats.connect`), its failure explained."""
        loop = asyncio.get_running_loop()
        self._fatal = loop.create_future()
        self._denied = loop.create_future()
        attempt: asyncio.Future[T] = asyncio.ensure_future(start(self.on_error))
        try:
            await _first(attempt, self._fatal)
        finally:
            if not attempt.done():
                attempt.cancel()  # a refused login or TLS failure: do not wait for retries
            await asyncio.gather(attempt, return_exceptions=True)  # its error is seen to
        if self._fatal.done():
            raise self._fatal.result()
        try:
            client = attempt.result()
        except Exception as exc:
            problem = explain(self.url, self.auth, exc, self.seen)
            if problem is None:
                raise
            raise problem from None
        self.connected = True
        return client

    async def guard(self, work: Awaitable[T]) -> T:
        """Run `work`; a permission the server refuses meanwhile fails it at once, naming
        the subject (a request to a denied subject would otherwise time out)."""
        task: asyncio.Future[T] = asyncio.ensure_future(work)
        if self._denied is None:
            return await task
        try:
            await _first(task, self._denied)
        finally:
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # its error is seen to
        if self._denied.done():  # even if the work returned: part of it was refused
            raise self._denied.result()
        return task.result()


async def _first(*futures: asyncio.Future[Any]) -> None:
    """Until one of `futures` is done."""
    await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)


def describe(exc: BaseException) -> dict[str, str]:
    """A client error as log fields: a permissions violation as its action and subject."""
    denied = permission(exc)
    if denied is not None:
        return {"permission_denied": denied[0], "subject": denied[1]}
    return {"error": f"{type(exc).__name__}: {exc}"}
