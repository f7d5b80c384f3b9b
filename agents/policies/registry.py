"""The policies by the name a run's ``policy`` field holds (``Goal.Policy``): the one place
the step runner finds a run's policy.

A module of its own, not the package's ``__init__``: the tools import
``agents.policies.shared``, which imports the package first, and that must not load both
policies (optuna, the model client) with it.
"""

from __future__ import annotations

from agents.policies import llm, tuner
from agents.policies.protocol import ModulePolicy, Policy
from infraops.models import Goal

POLICIES: dict[str, Policy] = {
    Goal.Policy.LLM: ModulePolicy(llm),
    Goal.Policy.TUNER: ModulePolicy(tuner),
}
