"""Fixtures shared by the tests: identities and roster, a round plan; the shared helpers of ``tests/helpers/``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "helpers"))  # fedutil.py, hostile.py, inprocess.py, fake_worker.py, procs.py

from fedutil import Federation, make_federation, make_plan  # noqa: E402


@pytest.fixture(scope="session")
def federation(tmp_path_factory) -> Federation:
    return make_federation(tmp_path_factory.mktemp("identities"), ["alice", "bob", "carol", "mallory"])


@pytest.fixture
def plan():
    return make_plan
