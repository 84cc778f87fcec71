"""Choosing among workers, without I/O: the policies (``policies.make_policy``, ``RoutingRequest``), the
KV-cache index they read (``kv_index.KvIndex``), the circuit breaker (``breaker.CircuitBreaker``) and
retry timing (``retry.RetryConfig``, ``backoff_s``). The router that applies a policy to the registry's
workers is ``gateway.workers.router``.
"""
