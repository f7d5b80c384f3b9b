"""The agent's policies, one module each: ``llm`` (a model behind an OpenAI-compatible
endpoint, with tools) and ``tuner`` (optuna over the manifest's knobs, no model). Each
implements :class:`agents.policies.outcome.Policy`; what they share is in ``shared``."""

from __future__ import annotations

from agents.policies.outcome import Policy


def policy_of(name: str) -> Policy:
    """The policy module for a run's ``policy`` field."""
    from agents.policies import llm, tuner

    modules: dict[str, Policy] = {"llm": llm, "tuner": tuner}
    return modules[name]
