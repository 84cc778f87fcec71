"""Who is calling, and what they may do: API keys (hashed), roles, per-key model allowlists.

What other packages use: ``Authenticator`` (credential -> ``Principal``),
``AuthConfig`` and ``JwtConfig``, ``Role``, ``Access``, the errors
``Unauthenticated``, ``Forbidden`` and ``KeysUnknown`` (mapped to 401, 403 and 503 by
``gateway.api``, never here) and ``KeysMissing`` (await ``Authenticator.refresh_keys``, then retry).
"""

from .authenticator import Access, Authenticator, AuthConfig
from .errors import AuthError, Forbidden, KeysUnknown, Unauthenticated
from .jwt_verifier import JwtConfig, KeysMissing
from .principal import ANONYMOUS, Principal, Role

__all__ = ["ANONYMOUS", "Access", "AuthConfig", "AuthError", "Authenticator", "Forbidden", "JwtConfig", "KeysMissing",
           "KeysUnknown", "Principal", "Role", "Unauthenticated"]
