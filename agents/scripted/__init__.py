"""A model played by code: a real local OpenAI-compatible endpoint (`endpoint`) answering
with a scripted agent's tool calls (`agent`). The tests script agents with it, and
`manage.py demo_llm` serves the demo's agent (`demo`), so a user without an API key sees the
LLM loop work on the demo target (`standalone --demo-llm`)."""
