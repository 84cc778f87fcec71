"""Who is calling, and what they may do: API keys (hashed), roles, per-key model allowlists.

What other packages use: ``Authenticator`` (credential -> ``Principal``),
``AuthConfig``, ``Role``, ``Access`` and the errors ``Unauthenticated`` and
``Forbidden`` (mapped to 401 and 403 by ``gateway.api``, never here).
"""

from .authenticator import Access, Authenticator, AuthConfig
from .errors import AuthError, Forbidden, Unauthenticated
from .principal import ANONYMOUS, Principal, Role

__all__ = ["ANONYMOUS", "Access", "AuthConfig", "AuthError", "Authenticator", "Forbidden", "Principal", "Role",
           "Unauthenticated"]
