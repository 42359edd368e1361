"""A site's checkpoints: atomic, verified training-state saves that resume, and Hugging Face exports (:mod:`.store`)."""
