"""The ``smg-node`` command (``gateway.cli:main``, ``python -m gateway.cli``): ``serve`` (``serve.py``), and the
clients of a node's control plane and admin endpoint (``keys.py``, ``workers.py``, ``node_client.py``), the demo's
simulated engines (``sim_engines.py``), the README's tables of what plugs in (``catalog.py``). Loading it loads no
serving machinery: ``serve`` imports the node only when it runs."""

from .command import main

__all__ = ["main"]
