"""The ``shardline demo`` command's parts: scenario files, the built-in seed cases, the replay
driver over the public :class:`shardline.Topology` API, and its plain and ``rich`` views; and the
worker-pool scenario over the public :class:`shardline.WorkerProxy` API (real worker processes by
default, or in-process), with its views; and the registration part: a replica swap whose
replacement never comes up, over :mod:`shardline.registration`, with its views; and the
topology part against a live cluster (``--pg DSN``), polled with ``PollingSource``.

Each name is imported with its module on first use: the views need ``rich`` (the ``cli``
extra), the command's option defaults do not.
"""

from typing import TYPE_CHECKING

from shardline._lazy import lazy_exports

if TYPE_CHECKING:
    from shardline.demo.live import LiveDemo, LiveDemoError, LivePoll
    from shardline.demo.live_view import render_live_plain, render_live_rich
    from shardline.demo.pool import PoolDemoError, PoolRun, PoolView, run_pool_demo
    from shardline.demo.pool_processes import run_process_pool_demo
    from shardline.demo.pool_view import (
        PlainPoolView,
        RichPoolView,
        render_pool_plain,
        render_pool_rich,
    )
    from shardline.demo.registration import (
        RegistrationDemoError,
        RegistrationRun,
        run_registration_demo,
    )
    from shardline.demo.registration_view import (
        render_registration_plain,
        render_registration_rich,
    )
    from shardline.demo.replay import Clearing, MasterRequests, Replay, StepReport, TierState
    from shardline.demo.scenario import Scenario, ScenarioError, load_scenario, parse_scenario
    from shardline.demo.seed_cases import seed_cases
    from shardline.demo.view import render_plain, render_rich

__all__ = [
    "Clearing",
    "LiveDemo",
    "LiveDemoError",
    "LivePoll",
    "MasterRequests",
    "PlainPoolView",
    "PoolDemoError",
    "PoolRun",
    "PoolView",
    "RegistrationDemoError",
    "RegistrationRun",
    "Replay",
    "RichPoolView",
    "Scenario",
    "ScenarioError",
    "StepReport",
    "TierState",
    "load_scenario",
    "parse_scenario",
    "render_live_plain",
    "render_live_rich",
    "render_plain",
    "render_pool_plain",
    "render_pool_rich",
    "render_registration_plain",
    "render_registration_rich",
    "render_rich",
    "run_pool_demo",
    "run_process_pool_demo",
    "run_registration_demo",
    "seed_cases",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "shardline.demo.live": ["LiveDemo", "LiveDemoError", "LivePoll"],
        "shardline.demo.live_view": ["render_live_plain", "render_live_rich"],
        "shardline.demo.pool": ["PoolDemoError", "PoolRun", "PoolView", "run_pool_demo"],
        "shardline.demo.pool_processes": ["run_process_pool_demo"],
        "shardline.demo.pool_view": [
            "PlainPoolView",
            "RichPoolView",
            "render_pool_plain",
            "render_pool_rich",
        ],
        "shardline.demo.registration": [
            "RegistrationDemoError",
            "RegistrationRun",
            "run_registration_demo",
        ],
        "shardline.demo.registration_view": [
            "render_registration_plain",
            "render_registration_rich",
        ],
        "shardline.demo.replay": [
            "Clearing",
            "MasterRequests",
            "Replay",
            "StepReport",
            "TierState",
        ],
        "shardline.demo.scenario": ["Scenario", "ScenarioError", "load_scenario", "parse_scenario"],
        "shardline.demo.seed_cases": ["seed_cases"],
        "shardline.demo.view": ["render_plain", "render_rich"],
    },
)
