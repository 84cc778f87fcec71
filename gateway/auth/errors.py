"""Authentication errors, without HTTP: ``gateway.api.errors`` maps them (401 and 403).

    AuthError
      Unauthenticated   no credential where one is needed, or one we do not know
      Forbidden         a known credential without the right to this (role, model)
      KeysUnknown       inference refused: the node's keys on disk could not be read whole, and none are known yet
"""

from __future__ import annotations


class AuthError(Exception):
    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class Unauthenticated(AuthError):
    def __init__(self, message: str, code: str = "invalid_api_key", *, credential_given: bool = False) -> None:
        super().__init__(message, code)
        self.credential_given = credential_given  # WWW-Authenticate then says error="invalid_token"


class Forbidden(AuthError):
    pass


class KeysUnknown(AuthError):
    """The node could not read all of its durable state back and knows no key for inference: it may have had some,
    so it refuses inference rather than open it (issue 62) until the keys arrive from a peer or an operator says
    the loss is accepted (``smg-node data accept``)."""
