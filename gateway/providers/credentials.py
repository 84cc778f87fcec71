"""A target's credential: always a reference, resolved when a call is made, never written in the models config.

    env:NAME        the environment variable NAME (read at each call: a rotated variable is a restart away,
                    as for every other secret of the node's)
    file:PATH       the file's content, stripped (a mounted Kubernetes Secret, a Docker secret); read again when
                    its modification time changes, so a rotated file is picked up without a restart
    aws             AWS's standard chain (environment, shared credentials and config files, the container's or
                    the instance's role), by botocore, refreshed before it expires: Bedrock's targets
    aws:PROFILE     the same from the named profile of the shared files

A value that is none of these is refused when the config is read: a key pasted into a file that is shown, copied
and kept in version control is a key leaked. Resolved secrets are handed to the provider's ``call`` and nowhere
else: never logged, stored, traced, or sent to another target (``dispatch.py`` sends each call to its own target
only).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any


class CredentialError(Exception):
    """A credential that cannot be resolved now (a variable unset, a file unreadable): the target is skipped."""


@dataclasses.dataclass(frozen=True)
class Credential:
    kind: str  # env, file, aws
    ref: str  # the variable, the path, the profile ("" for AWS's default chain)

    @classmethod
    def parse(cls, value: Any, where: str) -> "Credential":
        if not isinstance(value, str) or not value:
            raise ValueError(f"{where}: a credential is a reference: env:NAME, file:PATH or aws[:PROFILE]")
        kind, sep, ref = value.partition(":")
        if kind == "aws":
            return cls("aws", ref)
        if not sep or kind not in ("env", "file") or not ref:
            raise ValueError(f"{where}: a credential is a reference (env:NAME, file:PATH or aws[:PROFILE]), never "
                             f"the secret itself")
        return cls(kind, ref)

    def __str__(self) -> str:  # what logs and `smg-node models` show: the reference, never the secret
        return f"{self.kind}:{self.ref}" if self.ref else self.kind


class Secrets:
    """Resolves credentials: environment variables at each call, files when they change, AWS's chain through
    botocore (``aws_credentials``)."""

    def __init__(self, environ: "dict[str, str] | None" = None) -> None:
        self._environ = environ if environ is not None else os.environ
        self._files: dict[str, tuple[float, str]] = {}  # path: (mtime, content)
        self._aws: dict[str, Any] = {}  # profile: botocore's refreshable credentials

    def resolve(self, credential: "Credential | None") -> Any:
        if credential is None:
            return None
        if credential.kind == "env":
            value = self._environ.get(credential.ref)
            if not value:
                raise CredentialError(f"the environment variable {credential.ref} is not set")
            return value
        if credential.kind == "file":
            return self._file(credential.ref)
        return self.aws_credentials(credential.ref)

    def _file(self, path: str) -> str:
        try:
            mtime = os.stat(path).st_mtime
            cached = self._files.get(path)
            if cached is not None and cached[0] == mtime:
                return cached[1]
            with open(path, encoding="utf-8") as f:
                content = f.read().strip()
        except OSError as e:
            raise CredentialError(f"the credential file {path} cannot be read: {e.strerror}") from None
        if not content:
            raise CredentialError(f"the credential file {path} is empty")
        self._files[path] = (mtime, content)
        return content

    def aws_credentials(self, profile: str) -> Any:
        """Frozen AWS credentials (access key, secret key, session token) from botocore's chain for ``profile``
        (its default when empty); botocore refreshes temporary ones before they expire. The chain's lookups
        (files, the instance's metadata service) are made once per profile; call it from a thread the first
        time (``dispatch.py`` does)."""
        credentials = self._aws.get(profile)
        if credentials is None:
            import botocore.session  # Bedrock's targets only: botocore is not loaded by a node without one

            session = botocore.session.Session(profile=profile or None)
            credentials = session.get_credentials()
            if credentials is None:
                raise CredentialError("no AWS credentials in the environment, the shared files or a role")
            self._aws[profile] = credentials
        return credentials.get_frozen_credentials()

    def aws_ready(self, profile: str) -> bool:
        """Whether ``profile``'s credentials can be given now without I/O: looked up already, and not temporary ones
        due for a refresh (a role's, which botocore fetches again from the metadata service)."""
        credentials = self._aws.get(profile)
        refresh_needed = getattr(credentials, "refresh_needed", None)
        return credentials is not None and not (refresh_needed is not None and refresh_needed())

