"""The coordinator: the step loop, its pure phases (plan, re-verify, capability table), state and step records.

Written against a small transport interface (:class:`hacrl_fed.coordinator.rounds.Transport`);
Flower supplies one (:mod:`hacrl_fed.flower.server_app`), tests an in-process one.
"""
