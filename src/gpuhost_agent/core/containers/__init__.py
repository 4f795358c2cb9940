"""Containers as the marketplace sees them: their list, their states, the engine's events."""
