"""Rollout-only sites: a model behind an OpenAI-compatible API contributes verified rollouts, never trained
(docs/cross-vendor.md)."""

from hacrl_fed.contributor.endpoint_worker import EndpointWorker, endpoint_fingerprint

__all__ = ["EndpointWorker", "endpoint_fingerprint"]
