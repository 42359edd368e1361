"""Rollout engines: generate a plan's responses and their behaviour log-probs (Hugging Face ``generate``, vLLM)."""
