from __future__ import annotations

import copy

import pytest

from hacrl_fed.data.prompts import PLAIN_TEMPLATE, render_prompt, render_prompt_text

SYSTEM = "Solve the problem. Put the final answer in \\boxed{}."
PROBLEM = "What is 7 + 5?"


def test_chat_template_renders_system_user_and_generation_prompt(bpe):
    text = render_prompt_text(bpe, PROBLEM, system_prompt=SYSTEM)
    assert text == (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{PROBLEM}<|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = render_prompt(bpe, PROBLEM, system_prompt=SYSTEM)
    assert ids == bpe(text, add_special_tokens=False).input_ids
    assert bpe.decode(ids) == text


def test_empty_system_prompt_has_no_system_turn(bpe):
    text = render_prompt_text(bpe, PROBLEM, system_prompt="")
    assert "system" not in text and text.startswith("<|im_start|>user\n")


def test_plain_template_with_bos(unigram):
    assert not unigram.chat_template
    text = render_prompt_text(unigram, PROBLEM, system_prompt=SYSTEM)
    assert text == "<bos>" + PLAIN_TEMPLATE.format(system_prompt=SYSTEM, problem=PROBLEM)
    ids = render_prompt(unigram, PROBLEM, system_prompt=SYSTEM)
    assert ids[0] == unigram.bos_token_id and ids.count(unigram.bos_token_id) == 1
    assert ids[1:] == unigram(PLAIN_TEMPLATE.format(system_prompt=SYSTEM, problem=PROBLEM),
                              add_special_tokens=False).input_ids


def test_plain_forced_on_chat_tokenizer_without_bos(bpe):
    ids = render_prompt(bpe, PROBLEM, system_prompt=SYSTEM, template="plain")
    assert bpe.bos_token_id is None
    assert bpe.decode(ids) == f"{SYSTEM}\n\nQuestion: {PROBLEM}\nAnswer:"


def test_template_without_system_role_folds_system_into_user(bpe):
    tok = copy.deepcopy(bpe)
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' %}"
                         "{{ raise_exception('System role not supported') }}{% endif %}"
                         "<u>{{ m['content'] }}</u>{% endfor %}{% if add_generation_prompt %}<a>{% endif %}")
    assert render_prompt_text(tok, PROBLEM, system_prompt=SYSTEM) == f"<u>{SYSTEM}\n\n{PROBLEM}</u><a>"


def test_left_truncation(unigram):
    full = render_prompt(unigram, PROBLEM, system_prompt=SYSTEM)
    cut = render_prompt(unigram, PROBLEM, system_prompt=SYSTEM, max_tokens=5)
    assert cut == full[-5:]
    assert render_prompt(unigram, PROBLEM, system_prompt=SYSTEM, max_tokens=10_000) == full


def test_bad_arguments(bpe):
    with pytest.raises(ValueError, match="template"):
        render_prompt(bpe, PROBLEM, system_prompt=SYSTEM, template="chatml")
    with pytest.raises(ValueError, match="max_tokens"):
        render_prompt(bpe, PROBLEM, system_prompt=SYSTEM, max_tokens=0)
