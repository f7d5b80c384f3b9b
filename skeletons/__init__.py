"""The skeleton library: techniques with checkable conditions, evidence and provenance, and a
record of every use. It sits above ``agents`` and ``reviews``: it registers the agent's skeleton
tools and hears of submitted, decided and merged changes through their signals."""
