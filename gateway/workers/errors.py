"""Why a worker could not be registered or removed (``gateway.api`` maps each to its status)."""

from __future__ import annotations

from ..base.errors import AlreadyExists, GatewayError, InvalidInput, NotAllowed, NotKnown, Unreachable


class WorkerError(GatewayError):
    """Registration or removal failed; the subclass says why."""


class WorkerUrlInvalid(WorkerError, InvalidInput):
    """Not a worker origin, or a worker that serves no model."""


class WorkerHostRefused(WorkerError, NotAllowed):
    """The host is outside --worker-allowed-hosts."""


class WorkerExists(WorkerError, AlreadyExists):
    pass


class WorkerUnknown(WorkerError, NotKnown):
    pass


class WorkerUnreachable(WorkerError, Unreachable):
    """The worker did not answer what registration asks (its model, its tokenizer)."""
