"""What one gateway process holds: settings, the store, the routing table, the engine pools,
and the adapter-change callable handed in by deploy/ (None until it is)."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from common.lifecycle import AdapterChange
from common.settings import Settings
from common.store import Store
from router.engine_client import EnginePool
from router.examples import Examples
from router.route_table import RouteTable
from tasks import check_settings, examples_tasks

AdapterAction = Callable[..., Awaitable[AdapterChange]]  # (Action, task or version, share=None) -> what it did: HotSwap.act


@dataclass
class GatewayState:
    settings: Settings
    store: Store
    routes: RouteTable
    pools: dict[str, EnginePool]  # "base", "think"
    adapter_action: AdapterAction | None = None
    examples: Examples | None = None  # the team's corrections at once; built from the settings when not handed in

    def __post_init__(self):
        check_settings(self.settings)  # a setting that names no task stops the gateway before it serves
        if self.examples is None:
            s = self.settings
            self.examples = Examples(self.store, examples_tasks(s), s.examples_k, s.exact_repeats, s.examples_poll_s,
                                     s.datasets_dir)
