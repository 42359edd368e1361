"""An exported model says how it was prompted in training (issue 29, item 1): the template, the system prompt and
the stop strings travel with it (``hacrl_fed_prompt.json``, ``generation_config.json``, the tokenizer's chat
template), plain ``transformers`` renders the training prompt and stops where training stopped, and
``hacrl-fed eval`` on the export uses them unless a flag says otherwise."""

from __future__ import annotations

import json
import os

import pytest
import torch
from typer.testing import CliRunner

from hacrl_fed.cli import app
from hacrl_fed.data.prompts import PROMPT_FILE, prompt_record, render_prompt, response_separator, stop_strings
from hacrl_fed.rollout.engine import HFRolloutEngine, Sampling, eos_token_ids
from hacrl_fed.tokenization.retokenize import decode_text
from hacrl_fed.v1 import worker_pb2 as wpb
from hacrl_fed.checkpoints.store import export_hf

SYSTEM = "Add the numbers. End with \\boxed{N}."
PROBLEMS = ["What is 7 + 5?", "Compute 17 * 4, then add 5 to the result."]
GREEDY = Sampling(temperature=0.0, max_new_tokens=24)


def _stop_at_a_token_boundary(tokenizer, ids: list[int]) -> str:
    """Two tokens' text of a greedy response that first occur where they stand, after at least one token: a stop
    string the model really writes, starting at a token boundary (so the cut before it keeps whole tokens)."""
    text = decode_text(tokenizer, ids)
    for j in range(1, len(ids) - 2):
        head = decode_text(tokenizer, ids[:j])
        piece = decode_text(tokenizer, ids[:j + 2])[len(head):]
        if piece.strip() and piece.isprintable() and "\ufffd" not in piece and text.startswith(head) \
                and text.find(piece) == len(head):
            return piece
    raise AssertionError(f"no usable stop string in {text!r}")


def _training(lm, stops: list[str]) -> list:
    """Greedy responses of the training engine to :data:`PROBLEMS` under ``stops``."""
    engine = HFRolloutEngine(lm.model, lm.tokenizer, stop_strings=stops)
    prompts = [render_prompt(lm.tokenizer, p, system_prompt=SYSTEM) for p in PROBLEMS]
    return sorted(engine.generate(prompts, 1, GREEDY, seed=0), key=lambda g: g.prompt_index)


@pytest.fixture(params=["tiny-llama-bpe", "tiny-gemma-unigram"])
def exported(request, load_tiny, tmp_path):
    """``(lm, export dir, stop string, training's greedy responses)``: a tiny model exported with a stop string it
    writes in its greedy answer to the first problem."""
    lm = load_tiny(request.param)
    free = _training(lm, [])[0]
    stop = _stop_at_a_token_boundary(lm.tokenizer, list(free.response_ids))
    rec = prompt_record(lm.tokenizer, system_prompt=SYSTEM, stop=[stop],
                        eos_token_ids=eos_token_ids(lm.model, lm.tokenizer))
    out = export_hf(lm.model, lm.tokenizer, tmp_path / "export", prompt=rec)
    trained = _training(lm, [stop])
    assert trained[0].finish_reason == "stop" and stop not in trained[0].text
    return lm, out, stop, trained


def test_plain_transformers_renders_the_training_prompt_and_stops_where_training_stopped(exported):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lm, out, stop, trained = exported
    rec = json.loads((out / PROMPT_FILE).read_text(encoding="utf-8"))
    assert rec["system_prompt"] == SYSTEM and rec["stop_strings"] == [stop]
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    gen = json.loads((out / "generation_config.json").read_text(encoding="utf-8"))
    assert gen["stop_strings"] == [stop] and gen["eos_token_id"] == eos_token_ids(lm.model, lm.tokenizer)
    for problem, want in zip(PROBLEMS, trained):
        messages = [m | ({"content": problem} if m["role"] == "user" else {}) for m in rec["example"]["messages"]]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
        assert ids == render_prompt(lm.tokenizer, problem, system_prompt=SYSTEM)     # the training prompt
        with torch.no_grad():   # the saved generation config: greedy needs no flag, the stop strings the tokenizer
            new = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 tokenizer=tok, do_sample=False, max_new_tokens=GREEDY.max_new_tokens)[0, len(ids):]
        text = tok.decode(new, skip_special_tokens=True)
        assert stop in text or problem != PROBLEMS[0]      # the first answer holds the stop string (the fixture)
        if stop in text:
            assert stop not in tok.decode(new[:-1], skip_special_tokens=True), "went on past the stop string"
            assert text[:text.index(stop)] == want.text      # the response training scored: the text before it
        else:    # training ended at EOS or the length cap: so did plain generate
            assert text.strip() == want.text.strip() and stop not in text


def test_the_plain_template_export_renders_question_answer_and_stays_plain_in_hacrl_fed(load_tiny, tmp_path):
    """A base model trained under the plain template: its export's chat template renders that template, its
    generation config stops at "\\nQuestion:", and hacrl-fed loading the export again still treats it as a
    plain-template model (same stop string, same response separator)."""
    from transformers import AutoTokenizer

    from hacrl_fed.config import ModelConfig
    from hacrl_fed.worker.models import load_model

    lm = load_tiny("tiny-gemma-unigram")
    assert not lm.tokenizer.chat_template
    rec = prompt_record(lm.tokenizer, system_prompt=SYSTEM, eos_token_ids=eos_token_ids(lm.model, lm.tokenizer))
    out = export_hf(lm.model, lm.tokenizer, tmp_path / "export", prompt=rec)
    assert not lm.tokenizer.chat_template                           # the live tokenizer is left as it was
    assert rec["template"] == "plain" and rec["stop_strings"] == ["\nQuestion:"] and rec["response_separator"] == " "
    assert rec["example"]["prompt"] == f"<bos>{SYSTEM}\n\nQuestion: Calculate 2 + 3.\nAnswer:"
    gen = json.loads((out / "generation_config.json").read_text(encoding="utf-8"))
    assert gen["stop_strings"] == ["\nQuestion:"]
    tok = AutoTokenizer.from_pretrained(out)
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 7 + 5?"},
            {"role": "assistant", "content": "12"}, {"role": "user", "content": "What is 1 + 1?"}]
    assert tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == \
        f"<bos>{SYSTEM}\n\nQuestion: What is 7 + 5?\nAnswer: 12\nQuestion: What is 1 + 1?\nAnswer:"
    again = load_model(ModelConfig(name_or_path=str(out)))
    assert stop_strings(again.tokenizer) == ["\nQuestion:"] and response_separator(again.tokenizer) == " "
    assert render_prompt(again.tokenizer, "x", system_prompt=SYSTEM) == render_prompt(lm.tokenizer, "x",
                                                                                      system_prompt=SYSTEM)


def test_the_worker_exports_with_its_own_prompt_settings(make_sites, tmp_path):
    sites = make_sites({"alice": "tiny-llama-bpe"}, model_kw={"system_prompt": SYSTEM, "stop": ["####"]})
    worker = sites.start("alice")
    target = worker.path_roots[0] / "x"     # a Checkpoint request may only name a path inside the site
    out = worker.checkpoint(wpb.CheckpointRequest(kind=wpb.CheckpointRequest.EXPORT, path=str(target))).path
    rec = json.loads((target / PROMPT_FILE).read_text(encoding="utf-8"))
    assert out == os.path.realpath(target) and rec["template"] == "chat" and rec["system_prompt"] == SYSTEM
    assert rec["stop_strings"] == ["####"] and rec["eos_token_ids"] == worker.engine.eos_ids


def _problems(tmp_path):
    data = tmp_path / "problems.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{i}", "problem": p, "answer": "12"}) + "\n"
                            for i, p in enumerate(PROBLEMS)))
    return data


def test_eval_on_an_export_prompts_and_stops_as_training_did(exported, tmp_path):
    """`hacrl-fed eval --model EXPORT` takes the export's system prompt, template and stop strings: its greedy
    responses are training's, word for word. Flags still win."""
    lm, out, stop, trained = exported
    data = _problems(tmp_path)
    runner = CliRunner()
    res = runner.invoke(app, ["eval", "--model", str(out), "--data", str(data), "--max-new-tokens", "24", "--json",
                              "--out", str(tmp_path / "r.jsonl")])
    assert res.exit_code == 0, res.output
    template = json.loads((out / PROMPT_FILE).read_text())["template"]   # "plain" or "chat", as training
    assert f"prompt as in training ({out / PROMPT_FILE}; flags override): template {template}, system prompt " \
           f"\"{SYSTEM}\", stop strings {[stop]!r}" in res.stderr
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [r["responses"][0] for r in rows] == [g.text for g in trained]
    assert [r["finish_reasons"][0] for r in rows] == [g.finish_reason for g in trained]
    res = runner.invoke(app, ["eval", "--model", str(out), "--data", str(data), "--max-new-tokens", "4", "--json",
                              "--system-prompt", "Other.", "--stop", "", "--template", "plain"])
    assert res.exit_code == 0, res.output
    assert 'template plain, system prompt "Other.", stop strings []' in res.stderr


def test_eval_names_a_broken_prompt_file_with_exit_2(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / PROMPT_FILE).write_text('{"format": "something else"}')
    res = CliRunner().invoke(app, ["eval", "--model", str(tmp_path / "m"), "--data", str(_problems(tmp_path))])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert res.stderr.startswith(f"error: {tmp_path / 'm' / PROMPT_FILE}: not a hacrl-fed-prompt/1 record")


def test_eval_on_an_export_with_a_bad_data_file_says_one_line(exported, tmp_path):
    """The data file is checked before the export's prompt is read and announced: a bad file is one line, exit 2."""
    _, out, _, _ = exported
    data = tmp_path / "d.jsonl"
    data.write_text('{"foo": 1, "bar": 2}\n')
    res = CliRunner().invoke(app, ["eval", "--model", str(out), "--data", str(data)])
    assert res.exit_code == 2, res.output
    assert res.stderr == f"error: {data}:1: no problem text: expected a 'problem', 'question' or 'prompt' column\n"
