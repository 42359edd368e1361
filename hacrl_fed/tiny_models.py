"""Tiny, randomly initialised models with locally trained tokenizers, for tests and demos.

Two kinds with *incompatible* vocabularies, so cross-agent re-tokenization is exercised for real:

* ``tiny-llama-bpe``: Llama architecture, byte-level BPE tokenizer, a ChatML chat template, and
  pad == EOS (``<|im_end|>``) like SmolLM2 (ARCHITECTURE §8 "pad == EOS").
* ``tiny-gemma-unigram``: Gemma 3 architecture, SentencePiece-style Unigram tokenizer with a
  metaspace pre-tokenizer, a separate pad token and **no** chat template (a base model, like
  gemma3-270m).

Both are built in about a second on a CPU and saved as ordinary Hugging Face directories
(``config.json``, ``model.safetensors``, tokenizer files) that load with ``from_pretrained``.
"""

from __future__ import annotations

import random
import string
from pathlib import Path

TINY_KINDS = ("tiny-llama-bpe", "tiny-gemma-unigram")

_CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_WORDS = (
    "the answer is a an of to and we need add subtract multiply divide calculate compute what "
    "how many much total left each has have had gives gave buys bought sells apples pens books "
    "coins marbles cookies there are so then first next finally result equals sum difference "
    "product quotient problem solve step number final therefore Question Answer User Assistant "
    "Solve Put in boxed plus minus times over is"
).split()


def _corpus(seed: int = 0, lines: int = 1500) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice(["+", "-", "*", "/"])
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12)))
        out.append(f"{words} {a} {op} {b} = \\boxed{{{rng.randint(0, 9999)}}}. #### {a} $x^2$ (1/2) 3.5")
    out.extend([" ".join(string.printable.strip())] * 20)
    out.append("ñ é ü ß — “quotes” ‘single’ … π √ ∑ ≤ ≥ × ÷ 😀 中文 日本語 한국어")
    return out


def _bpe_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(1), trainer=trainer)
    return tok


def _unigram_tokenizer(vocab_size: int):
    """A Unigram (SentencePiece-style) tokenizer with a vocabulary counted from the corpus.

    The pieces and their log-frequency scores are computed directly (not by the EM trainer,
    whose multi-threaded float sums differ between runs), so the vocabulary is identical on
    every build.
    """
    import math
    from collections import Counter

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    counts: Counter[str] = Counter()
    for line in _corpus(2):
        for word in line.split():
            piece = "\u2581" + word
            counts[piece] += 1
            for size in (1, 2, 3):
                counts.update(word[i:i + size] for i in range(len(word) - size + 1))
    alphabet = sorted(set("".join(_corpus(2))) | set(string.printable.strip()) | set("\n\t≈") | {"\u2581"})
    chars = {c: max(counts[c], 1) for c in alphabet}
    multi = sorted(((p, n) for p, n in counts.items() if len(p) > 1), key=lambda pn: (-pn[1], pn[0]))
    budget = max(vocab_size - len(specials) - len(chars), 0)
    chosen = dict(chars) | dict(multi[:budget])
    total = sum(chosen.values())
    vocab = [(p, 0.0) for p in specials] + [
        (p, round(math.log(n / total), 6)) for p, n in sorted(chosen.items(), key=lambda pn: (-pn[1], pn[0]))
    ]
    tok = Tokenizer(models.Unigram(vocab, unk_id=specials.index("<unk>"), byte_fallback=False))
    tok.add_special_tokens(specials)
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    return tok


def build_tiny_model(kind: str, out_dir: str | Path, seed: int = 0, vocab_size: int | None = None) -> Path:
    """Build and save a tiny model + tokenizer of ``kind`` (one of :data:`TINY_KINDS`).

    Returns the directory. Raises ``ValueError`` for an unknown kind. Deterministic for a seed.
    """
    import torch
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    if kind == "tiny-llama-bpe":
        from transformers import LlamaConfig, LlamaForCausalLM

        raw = _bpe_tokenizer(vocab_size or 600)
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|im_end|>", bos_token=None,
            unk_token=None, clean_up_tokenization_spaces=False,
        )
        tokenizer.chat_template = _CHATML
        cfg = LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
            bos_token_id=None, tie_word_embeddings=True,
        )
        model = LlamaForCausalLM(cfg)
    elif kind == "tiny-gemma-unigram":
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        raw = _unigram_tokenizer(vocab_size or 700)
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=raw, eos_token="<eos>", pad_token="<pad>", bos_token="<bos>",
            unk_token="<unk>", clean_up_tokenization_spaces=False,
        )
        cfg = Gemma3TextConfig(
            vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=1024,
            sliding_window=64, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id, tie_word_embeddings=True,
        )
        model = Gemma3ForCausalLM(cfg)
    else:
        raise ValueError(f"unknown tiny model kind {kind!r}; choose one of {', '.join(TINY_KINDS)}")
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
