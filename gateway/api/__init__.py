"""HTTP: the routes and their handlers, the OpenAI error shape, and the HTTP/1.1 server.

Nothing below the API imports it (an import contract says so). What the node's runner uses:
``app.GatewayApp`` (the ASGI app), ``state.GatewayState`` (what handlers may use),
``h1server.H1Server``/``H1Config`` (the server), ``errors.transport_error_body`` (the server's own
answers in the OpenAI shape) and ``proxy.HttpProxy`` (relaying to OpenAI-compatible workers).
"""
