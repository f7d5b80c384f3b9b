"""Agent runs, their steps, policies, tools and the live stream."""
