"""Authentication errors, without HTTP: ``gateway.api.errors`` maps them (401 and 403).

    AuthError
      Unauthenticated   no credential where one is needed, or one we do not know
      Forbidden         a known credential without the right to this (role, model)
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
