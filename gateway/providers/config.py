"""The providers subsystem's section and flags: where the models config is, and how targets cool down."""

from __future__ import annotations

import dataclasses

from ..base.options import Option
from .cooldowns import CooldownConfig


@dataclasses.dataclass(frozen=True)
class ProvidersConfig:
    # The models config (routes.py): public model names and the targets that answer them. None: every model is
    # served by the workers that serve it, as without this subsystem.
    models_config: str | None = None
    # A target that keeps failing is skipped this long before a probe (cooldowns.py says why these defaults).
    cooldown_s: float = CooldownConfig.cooldown_s
    cooldown_max_s: float = CooldownConfig.cooldown_max_s

    def cooldowns(self) -> CooldownConfig:
        return CooldownConfig(cooldown_s=self.cooldown_s, cooldown_max_s=self.cooldown_max_s)


OPTIONS = (
    Option("--models-config", "providers.models_config", str, "models as routes (TOML, or YAML for .yaml): public "
           "model names, their targets (hosted providers, the fleet's pools) in order, fallbacks, quotas, overflow; "
           "re-read on SIGHUP", "providers"),
    Option("--provider-cooldown-secs", "providers.cooldown_s", float, "how long a target that keeps failing is "
           "skipped before a probe (doubled per failed probe; a 429's retry-after is kept)", "providers"),
    Option("--provider-cooldown-max-secs", "providers.cooldown_max_s", float, "the longest cooldown, and the most "
           "of a retry-after that is kept", "providers"),
)
