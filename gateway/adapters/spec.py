"""What a LoRA adapter is to the cluster: a name requests use, the model it adapts, where its weights are on the
engines' disk, whether it stays loaded, and the id engines load it under.

A definition is a setting of the cluster's document (``adapter:<name>``), replicated and kept on disk as keys are:
every node resolves the same names, a restart of every node forgets none. The id is minted once, when the adapter
is defined (its name and a random suffix): an adapter defined again under the same name with other weights gets
another id, so an engine still holding the old weights is never asked for the new ones by the old id.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ..base.ids import new_id

SETTING_PREFIX = "adapter:"  # a definition's setting: adapter:<name> -> its fields; None once removed
# A name as requests write it: no ":" (base:adapter names one of a model's adapters), no "/" (its admin paths end
# in /load and /unload), no spaces or controls.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
PATH_CHARS_MAX = 4096
ADAPTERS_MAX = 1000  # definitions the cluster keeps: each is a line of /v1/models and of every node's memory


class AdapterInvalid(ValueError):
    """A definition refused: the message says which field and why."""


@dataclasses.dataclass(frozen=True)
class AdapterSpec:
    name: str
    base: str  # the model it adapts: workers serving it that load adapters may load it
    path: str  # its weights' directory, as the engines see their disk
    adapter_id: str  # the id engines load it under and requests name
    pinned: bool = False  # never unloaded to make room (the engine keeps it in its GPU pool too)

    def to_setting(self) -> dict[str, Any]:
        return {"base": self.base, "path": self.path, "id": self.adapter_id, "pinned": self.pinned}


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise AdapterInvalid("an adapter's name is 1 to 128 letters, digits and . _ - (no ':' or '/'), starting with a "
                             "letter or digit")
    return name


def new_spec(name: Any, base: Any, path: Any, pinned: Any = False) -> AdapterSpec:
    """A definition from an operator's fields, checked, with a fresh id."""
    check_name(name)
    if not isinstance(base, str) or not base or len(base) > 256:
        raise AdapterInvalid("'base' names the model the adapter adapts")
    if not isinstance(path, str) or not path.strip() or len(path) > PATH_CHARS_MAX or "\x00" in path:
        raise AdapterInvalid(f"'path' is the adapter's directory on the engines' disk (at most {PATH_CHARS_MAX} "
                             "characters)")
    if not isinstance(pinned, bool):
        raise AdapterInvalid("'pinned' is true or false")
    return AdapterSpec(name, base, path, new_id(f"{name}-lora"), pinned)


def spec_of_setting(name: str, value: Any) -> AdapterSpec:
    """A definition as the cluster's document holds it (a peer's: checked as an operator's would be)."""
    if not isinstance(value, dict) or not isinstance(value.get("id"), str) or not value["id"] or \
            len(value["id"]) > 200:
        raise AdapterInvalid(f"adapter {name!r}: a setting without its id")
    spec = new_spec(name, value.get("base"), value.get("path"), value.get("pinned", False))
    return dataclasses.replace(spec, adapter_id=value["id"])
