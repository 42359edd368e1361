"""A re-sent train order whose first copy was trained (a connection cut after the worker trained): the worker
answers that its weights already hold the step, and the coordinator counts the update as trained instead of
recording a failure that nothing reconciles on the last step."""

from __future__ import annotations

from hacrl_fed.coordinator.rounds import Reply
from hacrl_fed.coordinator.step_record import AgentStep, train_outcome
from hacrl_fed.protocol.site_reply import ALREADY_TRAINED
from hacrl_fed.v1 import rollout_pb2 as pb


def test_an_already_trained_answer_counts_as_trained():
    plan = pb.RoundPlan(run_id="r", step=4)
    entry = AgentStep(agent="alice", node_id=1, status="accepted")
    reply = Reply(1, error=f"FAILED_PRECONDITION: {ALREADY_TRAINED} step 4 of run 'r' is in this worker's weights")
    train_outcome(entry, reply, plan)
    assert (entry.status, entry.reason) == ("trained", "already_trained") and "step 4" in entry.detail


def test_other_refusals_and_timeouts_stay_failures():
    plan = pb.RoundPlan(run_id="r", step=4)
    for reply in (Reply(1, error="FAILED_PRECONDITION: no own rollouts for run 'r' step 4"),
                  Reply(1, timed_out=True, error=f"{ALREADY_TRAINED} but the reply timed out")):
        entry = AgentStep(agent="alice", node_id=1, status="accepted")
        train_outcome(entry, reply, plan)
        assert entry.status == "train_error"
