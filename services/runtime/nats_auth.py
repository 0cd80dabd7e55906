"""How a Loom process proves who it is to NATS, and how it checks the server: credentials and TLS.

Every live entry point (`loom serve`, `loom up`, `loom submit`, `status`, operator commands,
`loom log export`) takes the same options, from flags or, so that secrets stay out of `ps`,
from environment variables (a flag wins). The server decides what each identity may publish
and subscribe to (deploy/nats/auth.conf); this module only presents the identity, and
`services.runtime.nats_errors` tells apart what the server answers.
"""

from __future__ import annotations

import argparse
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

_LITERAL_TOKEN = re.compile(r"[A-Za-z0-9_-]+")

# Option (attribute) → environment variable.
ENV = {
    "user": "LOOM_NATS_USER",
    "password": "LOOM_NATS_PASSWORD",
    "creds": "LOOM_NATS_CREDS",
    "nkey": "LOOM_NATS_NKEY",
    "tls_ca": "LOOM_NATS_CA",
    "tls_cert": "LOOM_NATS_CERT",
    "tls_key": "LOOM_NATS_KEY",
    "inbox": "LOOM_NATS_INBOX",
}
DEFAULT_INBOX = "_INBOX"


class NatsAuthError(ValueError):
    """Inconsistent or unreadable credentials; the message names the option."""


@dataclass(frozen=True)
class NatsAuth:
    """Who connects (user/password, a `.creds` file, or an nkey seed file) and TLS files."""

    user: str | None = None
    password: str | None = None
    creds: str | None = None  # JWT + nkey seed, as `nsc` writes them
    nkey: str | None = None  # an nkey seed file (server config lists the public key)
    tls_ca: str | None = None  # CA that signed the server's certificate
    tls_cert: str | None = None  # client certificate, where the server verifies clients
    tls_key: str | None = None
    # Where replies to this client go. Each user gets its own (`_INBOX.<user>`), and the
    # server lets it subscribe there only, so no client can read another's replies (JetStream
    # deliveries included). A `.creds` or nkey login has no user name here: give it.
    inbox: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> NatsAuth:
        env = os.environ if env is None else env
        return cls(**{name: env.get(var) or None for name, var in ENV.items()})

    @classmethod
    def from_args(cls, args: argparse.Namespace,
                  env: Mapping[str, str] | None = None) -> NatsAuth:
        """Flags (`add_arguments`) over environment variables."""
        base = cls.from_env(env)
        given = {f.name: getattr(args, f"nats_{f.name}", None) for f in fields(cls)}
        auth = cls(**{k: v if v is not None else getattr(base, k) for k, v in given.items()})
        auth.check()
        return auth

    def check(self) -> None:
        if self.password is not None and self.user is None:
            raise NatsAuthError("--nats-password needs --nats-user (or LOOM_NATS_USER)")
        ways = [w for w, v in (("--nats-user", self.user), ("--nats-creds", self.creds),
                               ("--nats-nkey", self.nkey)) if v is not None]
        if len(ways) > 1:
            raise NatsAuthError(f"give one of {', '.join(ways)}, not several")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise NatsAuthError("--nats-tls-cert and --nats-tls-key go together")
        for flag, path in (("--nats-creds", self.creds), ("--nats-nkey", self.nkey),
                           ("--nats-tls-ca", self.tls_ca), ("--nats-tls-cert", self.tls_cert),
                           ("--nats-tls-key", self.tls_key)):
            if path is not None and not Path(path).is_file():
                raise NatsAuthError(f"{flag}: no such file {path!r}")
        prefix = self.inbox_prefix()
        if not all(_LITERAL_TOKEN.fullmatch(t) for t in prefix.split(".")):
            source = "--nats-inbox" if self.inbox is not None else "--nats-user"
            raise NatsAuthError(f"{source}: {prefix!r} is not a subject an inbox can live "
                                "under (letters, digits, '-', '_' and '.' between tokens); "
                                "give --nats-inbox")

    def inbox_prefix(self) -> str:
        if self.inbox is not None:
            return self.inbox
        return f"{DEFAULT_INBOX}.{self.user}" if self.user is not None else DEFAULT_INBOX

    def tls_context(self) -> ssl.SSLContext | None:
        """A verifying client context (server certificate checked against the CA)."""
        if self.tls_ca is None and self.tls_cert is None:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca)
        if self.tls_cert is not None and self.tls_key is not None:
            ctx.load_cert_chain(self.tls_cert, self.tls_key)
        return ctx

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `nats.connect`."""
        self.check()
        kw: dict[str, Any] = {"inbox_prefix": self.inbox_prefix()}
        if self.user is not None:
            kw["user"] = self.user
            kw["password"] = self.password or ""
        if self.creds is not None:
            kw["user_credentials"] = self.creds
        if self.nkey is not None:
            kw["nkeys_seed"] = self.nkey
        ctx = self.tls_context()
        if ctx is not None:
            kw["tls"] = ctx
        return kw

    def to_env(self) -> dict[str, str]:
        """The environment variables that reproduce these options (for child processes)."""
        return {ENV[f.name]: str(getattr(self, f.name)) for f in fields(self)
                if getattr(self, f.name) is not None}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The credential and TLS flags every live command takes."""
    g = parser.add_argument_group("NATS credentials and TLS (flags override LOOM_NATS_* "
                                  "environment variables)")
    g.add_argument("--nats-user", help=f"user name (${ENV['user']})")
    g.add_argument("--nats-password", help=f"password; prefer ${ENV['password']}, which "
                                           "`ps` does not show")
    g.add_argument("--nats-creds", help=f"credentials file, JWT + nkey seed (${ENV['creds']})")
    g.add_argument("--nats-nkey", help=f"nkey seed file (${ENV['nkey']})")
    g.add_argument("--nats-tls-ca", dest="nats_tls_ca",
                   help=f"CA certificate that signed the server's (${ENV['tls_ca']})")
    g.add_argument("--nats-tls-cert", dest="nats_tls_cert",
                   help=f"client certificate (${ENV['tls_cert']})")
    g.add_argument("--nats-tls-key", dest="nats_tls_key",
                   help=f"client certificate's key (${ENV['tls_key']})")
    g.add_argument("--nats-inbox", dest="nats_inbox",
                   help=f"subject prefix for replies to this client; default "
                        f"{DEFAULT_INBOX}.<user> (${ENV['inbox']})")
