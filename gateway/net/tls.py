"""TLS for clients: the server context from certificate files, mutual TLS, and reloads without a restart.

``ServerTls(cert_path, key_path, client_ca_path)`` builds one ``ssl.SSLContext``
(TLS 1.2 and up, ALPN ``http/1.1``) that the HTTP server wraps every accepted
connection in. With a client CA, a client must present a certificate it signed
(mutual TLS), checked in the handshake.

Reload: ``serve_reloads`` looks at the files' modification times every
``reload_interval_s`` and, when one changed, loads the chain again into the
same context: connections accepted afterwards get the new certificate,
connections already open keep theirs. A pair that does not load (a key that
does not match, a half-written file) is refused with a log line and the old
certificate stays in use. No I/O but reading those files.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import ssl
from pathlib import Path
from typing import Any

import trio

from ..base.options import Option
from ..base.subsystem import ConfigProblem, Subsystem

log = logging.getLogger("gateway.tls")


@dataclasses.dataclass(frozen=True)
class TlsConfig:
    cert_path: Path | None = None
    key_path: Path | None = None
    # Clients must present a certificate signed by this CA (mutual TLS).
    client_ca_path: Path | None = None
    # How often the files are checked for a new certificate. Certificates are renewed days ahead of
    # expiry; 10 s makes a rotation visible quickly for the cost of three stat() calls.
    reload_interval_s: float = 10.0
    # A client that has not finished its handshake by then is dropped (slow-handshake guard).
    handshake_timeout_s: float = 10.0

    @property
    def enabled(self) -> bool:
        return self.cert_path is not None


class ServerTls:
    def __init__(self, config: TlsConfig, context: ssl.SSLContext | None = None) -> None:
        """``context``: one made elsewhere (hypercorn makes its own, with its ALPN and ciphers) whose
        chain this object reloads; None: ours, for the native server."""
        if config.cert_path is None or config.key_path is None:
            raise ValueError("TLS needs both --tls-cert-path and --tls-key-path")
        self.config = config
        self._stamps = self._mtimes()
        self.reloads = 0
        if context is not None:
            self.context = context
            return
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        # A client-started TLS 1.2 renegotiation costs the server a handshake per request of it (a known
        # way to spend a server's CPU), and TlsSocket's writes rely on never having to read.
        self.context.options |= ssl.OP_NO_RENEGOTIATION
        self.context.set_alpn_protocols(["http/1.1"])
        if config.client_ca_path is not None:
            self.context.verify_mode = ssl.CERT_REQUIRED
            self.context.load_verify_locations(cafile=str(config.client_ca_path))
        self.context.load_cert_chain(str(config.cert_path), str(config.key_path))

    def _mtimes(self) -> tuple[float, ...]:
        paths = [self.config.cert_path, self.config.key_path, self.config.client_ca_path]
        return tuple(os.stat(p).st_mtime_ns if p is not None and os.path.exists(p) else 0 for p in paths)

    def reload_if_changed(self) -> bool:
        """Load the files again if any changed since the last load; True when a new chain is in use."""
        stamps = self._mtimes()
        if stamps == self._stamps:
            return False
        self._stamps = stamps
        try:
            self.context.load_cert_chain(str(self.config.cert_path), str(self.config.key_path))
            if self.config.client_ca_path is not None:
                self.context.load_verify_locations(cafile=str(self.config.client_ca_path))
        except (ssl.SSLError, OSError) as e:
            log.error("TLS certificate not reloaded (the previous one stays in use): %s", e)
            return False
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", self.config.cert_path)
        return True

    async def serve_reloads(self) -> None:
        while True:
            await trio.sleep(self.config.reload_interval_s)
            self.reload_if_changed()


# This subsystem's flags (gateway/base/options.py); their defaults are the config's above.
OPTIONS = (
    Option("--tls-cert-path", "tls.cert_path", Path, "serve HTTPS with this certificate chain (PEM); reloaded when "
           "the file changes", "security"),
    Option("--tls-key-path", "tls.key_path", Path, "the certificate's private key (PEM)", "security"),
    Option("--tls-client-ca-path", "tls.client_ca_path", Path, "require client certificates signed by this CA "
           "(mutual TLS)", "security"),
    Option("--tls-reload-interval-secs", "tls.reload_interval_s", float, "how often the certificate files are "
           "checked for a renewal (default 10)", "security"),
)


def _check(config: Any) -> None:
    if config.tls.enabled or config.tls.key_path is not None:
        try:
            ServerTls(config.tls)  # the files load, and the key matches the certificate
        except (ValueError, OSError, ssl.SSLError) as e:
            raise ConfigProblem(f"--tls-cert-path/--tls-key-path: {e}") from None


# TLS for clients as a subsystem of the node (gateway/base/subsystem.py): the HTTP servers take it from the config.
SUBSYSTEM = Subsystem("tls", TlsConfig(), OPTIONS, _check)
