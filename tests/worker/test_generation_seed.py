"""The sampling seed of a site's generation: reproducible across runs of the same config."""

from hacrl_fed.worker.agent import generation_seed


def test_generation_seed_depends_on_seed_step_and_agent_only():
    base = generation_seed(123, 4, "gemma3")
    assert base == generation_seed(123, 4, "gemma3")            # a timestamped run name cannot change it
    assert 0 <= base < 2**63
    assert len({base, generation_seed(124, 4, "gemma3"), generation_seed(123, 5, "gemma3"),
                generation_seed(123, 4, "smollm2")}) == 4
