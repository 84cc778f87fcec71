"""A node's process: its configuration, the server that wires it, the supervisor of --workers N."""
