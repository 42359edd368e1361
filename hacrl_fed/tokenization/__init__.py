"""Training views across tokenizers: own rows, re-tokenized foreign rows, the EOS convention (hacpo-spec §7)."""

from .retokenize import clean_response_text, cut_at_stop_strings, drift_stats, split_generated
from .views import TrainingRow, build_rows, collate, encode_response_text, foreign_row, own_row

__all__ = ["TrainingRow", "build_rows", "clean_response_text", "collate", "cut_at_stop_strings", "drift_stats", "encode_response_text",
           "foreign_row", "own_row", "split_generated"]
