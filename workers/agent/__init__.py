"""The node agent (``sie agent``): registration, reconcile loop, heartbeats. See ``loop.py``."""

from sie.workers.agent.loop import Agent, AgentConfig

__all__ = ["Agent", "AgentConfig"]
