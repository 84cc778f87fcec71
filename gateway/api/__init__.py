"""HTTP meaning: the routes and their handlers, the OpenAI error shape (the HTTP/1.1 transport is ``gateway/http1``).

Nothing below the API imports it (an import contract says so). What the node's runner uses:
``app.GatewayApp`` (the ASGI app), ``state.GatewayState`` (what handlers may use),
``errors.transport_error_body`` (the HTTP/1.1 server's own
answers in the OpenAI shape) and ``proxy.HttpProxy`` (relaying to OpenAI-compatible workers).
"""
