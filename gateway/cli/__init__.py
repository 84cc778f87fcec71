"""The ``smg-node`` command (``gateway.cli:main``, ``python -m gateway.cli``): ``serve`` (``serve.py``), and the
clients of a node's control plane and admin endpoint (``keys.py``, ``workers.py``, ``node_client.py``), the demo's
simulated engines (``sim_engines.py``), the docs' tables of what plugs in and of the options (``catalog.py``). Loading it loads no
serving machinery: ``serve`` imports the node only when it runs."""

from .command import main

__all__ = ["main"]
