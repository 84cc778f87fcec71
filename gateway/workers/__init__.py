"""The node's workers (engines and OpenAI-compatible HTTP workers) and the way to one of them.

    registry.WorkerRegistry   which workers exist: registration, health checks, load polls, drain,
                              the cluster's worker document
    worker.Worker             one worker as routing sees it; WorkerClient, what its client must do
    health.HealthTracker      healthy or not, from consecutive checks (pure, on passed-in time)
    router.Router             a worker for one attempt: candidates, then the routing policy
    attempt.WorkerAttempt     one attempt's bookkeeping: in-flight count and circuit verdict; abort_quietly
    pairing                   prefill/decode roles, and which two workers may pair
    kv_following              when this node follows an engine's KV events (kv_events: how)
    origin                    what a worker URL may be, and where workers may be registered
    errors                    why a registration failed (WorkerError and its kinds)

Other packages use the names below.
"""

from .attempt import AttemptFailed, WorkerAttempt, abort_quietly
from .errors import WorkerError, WorkerExists, WorkerHostRefused, WorkerUnknown, WorkerUnreachable, WorkerUrlInvalid
from .health import HealthConfig, HealthTracker, Verdict
from .origin import WorkerAllowlist, WorkerUrlError, parse_worker_origin
from .registry import WorkerRegistry, parse_worker_url
from .router import Router
from .worker import Worker, WorkerClient, worker_id_for

__all__ = ["AttemptFailed", "HealthConfig", "HealthTracker", "Router", "Verdict", "Worker", "WorkerAllowlist",
           "WorkerAttempt", "WorkerClient", "abort_quietly", "WorkerError", "WorkerExists", "WorkerHostRefused", "WorkerRegistry",
           "WorkerUnknown", "WorkerUnreachable", "WorkerUrlError", "WorkerUrlInvalid", "parse_worker_origin",
           "parse_worker_url", "worker_id_for"]
