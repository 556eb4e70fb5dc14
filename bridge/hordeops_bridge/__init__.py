"""hordeops-bridge: a horde worker in front of an OpenAI-compatible or KoboldAI model server."""

__version__ = "1.0.0"
