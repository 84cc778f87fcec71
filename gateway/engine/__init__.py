"""Talking to engines: gRPC (our HTTP/2 client ``h2grpc.H2GrpcClient`` or grpcio's ``bridge.GrpcBridge``),
the SGLang/vLLM services (``grpc_engine.GrpcEngineClient``), OpenAI-compatible HTTP workers
(``http_worker.HttpWorkerClient``), TLS to engines (``engine_tls``) and the errors of a call
(``errors.EngineCallError``, a gRPC status name; mapped to HTTP only in ``gateway.api``).
"""
