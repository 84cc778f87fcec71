"""``python -m gateway.cli``: the ``smg-node`` command."""

import sys

from .command import main

sys.exit(main())
