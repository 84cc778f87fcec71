"""LoRA adapters served on the fleet's engines: named by requests, loaded and unloaded at run time, routed to the
workers that hold them (spec.py: what one is; placement.py: where it goes, without I/O; service.py: the cluster's
definitions, the workers' holdings, the loads and unloads; subsystem.py: its flags)."""

from .service import AdapterService
from .spec import AdapterSpec

__all__ = ["AdapterService", "AdapterSpec"]
