"""One verifier pool for all reward tests (process start-up dominates their run time)."""

from __future__ import annotations

import pytest

from hacrl_fed.reward import Verifier

TIMEOUT_S = 2.0


@pytest.fixture(scope="session")
def verifier():
    with Verifier(timeout_s=TIMEOUT_S, workers=2) as v:
        yield v
