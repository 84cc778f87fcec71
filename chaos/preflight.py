"""What a chaos run needs before it starts, checked before anything is started.

A run takes minutes; finding at its end that the timeline cannot be drawn (matplotlib) or at its
start that the workload has no client (openai) or the balancer is not installed wastes them. The
Python packages are the ``chaos`` extra (``pip install 'smg-node[chaos]'``); nginx and HAProxy are
Debian packages.
"""

from __future__ import annotations

import importlib.util
import shutil

# Python package -> what it is for.
PYTHON_NEEDS = {"openai": "the workload's clients", "matplotlib": "the report's timeline"}


def missing(lb: str) -> list[str]:
    """One line per missing piece, saying how to get it; empty when the run can start."""
    problems = [f"the Python package {name!r} ({why}): pip install 'smg-node[chaos]'"
                for name, why in PYTHON_NEEDS.items() if importlib.util.find_spec(name) is None]
    if shutil.which(lb) is None:
        problems.append(f"the load balancer {lb!r}: apt-get install {lb}")
    return problems
