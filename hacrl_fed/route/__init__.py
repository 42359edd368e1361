"""Capability-aware routing between deployed models at inference (`hacrl-fed route`)."""
