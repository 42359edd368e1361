"""Asynchronous rounds (``run.mode = "async"``, docs/async.md): every site generates and trains at its own pace.

The coordinator's per-site loop (:func:`hacrl_fed.async_rounds.loop.run_async`) and its pure pool of accepted
batches with the staleness bounds (:mod:`hacrl_fed.async_rounds.pool`). Built on the synchronous round logic of
:mod:`hacrl_fed.coordinator` (same transport, phases, state and step records).
"""
