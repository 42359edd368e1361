"""Playing a policy with a rollout engine, without training it.

Evaluation on verifiable problems (:mod:`hacrl_fed.play.evaluate`: avg@k, the unbiased pass@k) and multi-turn
episodes of an environment (:mod:`hacrl_fed.play.episodes`: turn-by-turn generation, the training row and the wire
rollout of each episode). Takes an engine and a tokenizer; loading models is the worker's
(:mod:`hacrl_fed.worker.eval_model`).
"""
