"""A learner site's screens against poisoned peer rollouts: decisions (``rules``, ``phrases``; settings in
:mod:`hacrl_fed.screen_config`) and the site's guard over a run (``guard``)."""

from hacrl_fed.screens.guard import SiteGuard, cut_rollout

__all__ = ["SiteGuard", "cut_rollout"]
