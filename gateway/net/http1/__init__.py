"""The node's own HTTP/1.1 transport: a sans-I/O protocol core and the trio server that drives it.

``protocol.py`` holds the rules (a request reader over httptools, the response state machine, the
heads it frames), with no sockets, tasks or clocks; ``server.py`` owns the sockets, the tasks, time
and the ASGI application it calls. Nothing here knows what the routes mean: the API
(``gateway/api``) sits above it and gives the server even the bodies of its own refusals
(``H1Config.error_body``). ``--http-server hypercorn`` replaces this package, not the API.
"""

from .server import DISCONNECT_EXTENSION, H1Config, H1Server

__all__ = ["DISCONNECT_EXTENSION", "H1Config", "H1Server"]
