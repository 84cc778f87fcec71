"""Deployment files (nginx, HAProxy, compose, Kubernetes, systemd) and the balancer renderer.

What other packages may use: ``start_balancer``, ``stop_balancer``, ``balancer_argv`` and
``LOAD_BALANCERS`` (``balancer.py``), which render the templates beside it for processes on one
machine (the chaos harness, ``chaos/local_cluster.py``).
"""

from .balancer import LOAD_BALANCERS, balancer_argv, start_balancer, stop_balancer

__all__ = ["LOAD_BALANCERS", "balancer_argv", "start_balancer", "stop_balancer"]
