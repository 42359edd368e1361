"""Errors the agent worker raises on bad requests; the gRPC service maps them to status codes."""

from __future__ import annotations

__all__ = ["InvalidRequestError", "PreconditionError"]


class InvalidRequestError(ValueError):
    """The request itself is malformed (bad plan, empty prompts, bad sampling) → ``INVALID_ARGUMENT``."""


class PreconditionError(RuntimeError):
    """The request does not fit the worker's state (wrong run, no rollouts for this step).

    Mapped to ``FAILED_PRECONDITION``.
    """
