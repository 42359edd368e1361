"""A learner site's screens against poisoned peer rollouts (the decisions are :mod:`hacrl_fed.algo.screens`)."""

from hacrl_fed.screens.guard import SiteGuard, cut_rollout

__all__ = ["SiteGuard", "cut_rollout"]
