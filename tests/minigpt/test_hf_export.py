"""Exporting the course's models as Hugging Face folders: transformers loads them unchanged, the tokenizer.json
encodes the corpus token for token like the course's tiktoken BPE, and export -> import keeps the logits
bit for bit. About 15 s (two exports, the validation corpus encoded twice, transformers loading).
"""

from __future__ import annotations

import json

import pytest
import torch

from minigpt.checkpoint import load_model
from minigpt.hf.export import course_tokenizer, export_hf, main
from minigpt.paths import data_dir
from minigpt.serving.chat_template import render_chat
from minigpt.tokenizer import load_tokenizer, stop_token_ids, tokenizer_for
from minigpt.training.data import load_tokens

LOGIT_TOL = 1e-4          # fp32, absolute, the same as test_hf_import


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    assert main(["target", str(root / "target")]) == 0
    return {"target": root / "target", "draft": export_hf("draft", root / "draft")}


def test_folder_has_what_transformers_reads(exported):
    files = {p.name for p in exported["target"].iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= files
    cfg = json.loads((exported["target"] / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["tie_word_embeddings"] is True


@pytest.mark.parametrize("name", ["target", "draft"])
def test_export_then_import_gives_identical_logits_and_transformers_agrees(exported, name):
    from transformers import LlamaForCausalLM

    course, imported = load_model(name), load_model(exported[name])
    assert imported.config == course.config
    hf = LlamaForCausalLM.from_pretrained(exported[name], dtype=torch.float32).eval()
    tokens = load_tokens("val")
    for start, length in ((0, 512), (1000, 64), (5000, 8)):
        x = tokens[start:start + length][None].long()
        with torch.inference_mode():
            ours = course(x)
            assert torch.equal(imported(x), ours), f"{name}: export -> import changed the logits"
            err = (hf(x).logits - ours).abs().max().item()
        assert err < LOGIT_TOL, f"{name}, {length} tokens: transformers differs by {err:.2e} >= {LOGIT_TOL}"


def test_tokenizer_json_encodes_the_corpus_like_the_course_tokenizer():
    enc, tok = load_tokenizer(), course_tokenizer()
    text = (data_dir() / "corpus" / "val.txt").read_text(encoding="utf-8")
    want = enc.encode(text, allowed_special="all")
    got = tok.encode(text).ids
    first = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    assert got == want, f"{len(got)} vs {len(want)} tokens, first difference at token {first}"
    assert tok.decode(want, skip_special_tokens=False) == text


def test_transformers_tokenizer_and_chat_template_of_the_export(exported):
    from transformers import AutoTokenizer

    hf_tok, enc = AutoTokenizer.from_pretrained(exported["target"]), load_tokenizer()
    text = "def f(x):\n    return x  # ünïcode ✓\n<|endoftext|>Once"
    assert hf_tok(text)["input_ids"] == enc.encode(text, allowed_special="all")
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": " Hi! "}]
    assert hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == render_chat(messages)
    assert stop_token_ids(tokenizer_for(exported["target"])) == (enc.eot_token,)
