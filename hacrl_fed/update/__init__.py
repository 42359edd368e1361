"""The policy update: one optimizer step's machinery around the HACPO math of :mod:`hacrl_fed.algo`.

Mini-batches and token-budget micro-batches (:mod:`hacrl_fed.update.loop`, ``hacpo_update``), the learner's
token log-probs from a model forward, padded or packed (:mod:`hacrl_fed.update.logprobs`), the optimizer settings
(:mod:`hacrl_fed.update.optim_config`) and the learning-rate schedule (:mod:`hacrl_fed.update.schedule`).
"""
