"""The ``shardline demo`` command's parts: scenario files, the built-in seed cases, the replay
driver over the public :class:`shardline.Topology` API, and its plain and ``rich`` views.
"""

from shardline.demo.replay import Clearing, MasterRequests, Replay, StepReport, TierState
from shardline.demo.scenario import Scenario, ScenarioError, load_scenario, parse_scenario
from shardline.demo.seed_cases import seed_cases
from shardline.demo.view import render_plain, render_rich

__all__ = [
    "Clearing",
    "MasterRequests",
    "Replay",
    "Scenario",
    "ScenarioError",
    "StepReport",
    "TierState",
    "load_scenario",
    "parse_scenario",
    "render_plain",
    "render_rich",
    "seed_cases",
]
