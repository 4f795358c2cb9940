"""Renters' images on this machine: pulled by the agent with progress, one pull per reference."""
