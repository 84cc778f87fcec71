"""What can go wrong in the gateway's core, said without HTTP.

The core (workers, routing, generation, admission, the model catalog) raises
these; ``gateway/api/errors.py`` is the one place that turns them into a status
and an error body. Each class names a kind of failure a caller can act on, not
a status code:

    GatewayError(message, code=, retry_after_s=)
      InvalidInput        the caller sent something unusable (a malformed worker URL)
      NotAllowed          refused by policy (a worker host outside the allowlist)
      NotKnown            names nothing we have (a worker id)
      AlreadyExists       the thing is already there (a worker registered twice)
      Overloaded          too much in flight and the queue is full: come back later
      NoCapacity          nothing can serve it right now (no healthy worker, queue wait over)
      Unreachable         a worker or engine we depend on did not answer usably
      TimedOut            what holds the data a request needs did not answer in time (the peers
                          holding stored history, the history database): the node itself is fine,
                          so balancers must not take it out (504, not 503)
      TooLarge            one thing is over its size bound (a stored response, an answer's memory)
      QuotaExceeded       the caller holds as much of a shared resource as it may (its stored data)

``retry_after_s`` is a hint for the caller (Retry-After); ``code`` a stable
machine-readable reason (``no_healthy_worker``, ``queue_timeout``, ...); ``param`` the request field the
failure is about, when the core knows it (an image part that could not be fetched).
Engine call failures stay ``engine.errors.EngineCallError`` (a gRPC status name).
"""

from __future__ import annotations


class GatewayError(Exception):
    def __init__(self, message: str, *, code: str | None = None, retry_after_s: int | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.retry_after_s = retry_after_s
        self.param = param  # the request field it is about, when one is (an image part: messages[0].content[1])


class InvalidInput(GatewayError):
    pass


class NotAllowed(GatewayError):
    pass


class NotKnown(GatewayError):
    pass


class AlreadyExists(GatewayError):
    pass


class Overloaded(GatewayError):
    pass


class NoCapacity(GatewayError):
    pass


class Unreachable(GatewayError):
    pass


class TimedOut(GatewayError):
    pass


class TooLarge(GatewayError):
    pass


class QuotaExceeded(GatewayError):
    pass
