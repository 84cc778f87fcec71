"""The authenticated caller: identity, tenant, role and the models it may use."""

from __future__ import annotations

import dataclasses
import enum


class Role(enum.Enum):
    """``admin``: the control plane (workers, rate limits, API keys, mesh) and inference;
    ``user``: inference only."""

    ADMIN = "admin"
    USER = "user"


@dataclasses.dataclass(frozen=True, slots=True)
class Principal:
    # Stable and not secret: rate limits and stored data are keyed by it ("key:<id>", "anonymous").
    key_id: str
    name: str
    role: Role
    tenant: str | None = None
    models: frozenset[str] | None = None  # None: every model

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN

    @property
    def authenticated(self) -> bool:
        return self is not ANONYMOUS

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models


# Who calls the data plane when it is open (no user credential configured).
ANONYMOUS = Principal("anonymous", "anonymous", Role.USER)
