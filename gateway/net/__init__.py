"""Sockets and the protocols on them: the HTTP/1.1 server, fast reads and writes, TLS, outbound policy."""
