"""The agent's policies, one module each: ``llm`` (a model behind an OpenAI-compatible
endpoint, with tools) and ``tuner`` (optuna over the manifest's knobs, no model). What the
step runner calls is :class:`agents.policies.protocol.Policy`; ``registry.POLICIES`` holds
both by name. What they share is in ``shared``; what a step comes to, in ``outcome``."""
