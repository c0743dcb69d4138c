"""Importing Hugging Face Llama-family folders: configs accepted and refused, tokenizer, chat template, logits.

A random LlamaForCausalLM written by transformers itself (hf_fixtures: 3 layers, GQA 4/2, untied head,
llama3 RoPE scaling, bf16, 8 safetensors shards) is loaded by the course and compared with transformers
in fp32. About 10 s, most of it importing transformers.
"""

from __future__ import annotations

import json

import pytest
import torch
from hf_fixtures import write_random_llama

from minigpt.checkpoint import load_model
from minigpt.config import Llama3RopeScaling
from minigpt.hf.config import UnsupportedModel, config_from_hf
from minigpt.hf.tokenizer import HFTokenizer
from minigpt.serving.chat_template import PLAIN_CHAT, chat_template_for
from minigpt.tokenizer import load_tokenizer, stop_token_ids, tokenizer_for

LOGIT_TOL = 1e-4          # fp32, absolute: measured errors are 2e-6 (random model) to 1.4e-5 (target, 512 tokens)

# The shape of published configs (values as in their config.json files), read without any weights.
LLAMA_32_1B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
               "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
               "head_dim": 64, "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
               "rope_theta": 500000.0, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                                        "original_max_position_embeddings": 8192, "rope_type": "llama3"},
               "tie_word_embeddings": True, "vocab_size": 128256, "attention_bias": False, "mlp_bias": False,
               "bos_token_id": 128000, "eos_token_id": 128001, "pretraining_tp": 1, "torch_dtype": "bfloat16"}
TINYLLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
             "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
             "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_scaling": None,
             "tie_word_embeddings": False, "vocab_size": 32000, "torch_dtype": "bfloat16"}
SMOLLM2_135M = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
                "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                "hidden_act": "silu", "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000,
                "rope_scaling": None, "tie_word_embeddings": True, "vocab_size": 49152, "attention_bias": False,
                "mlp_bias": False, "pretraining_tp": 1}
MISTRAL_7B_V03 = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
                  "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                  "num_key_value_heads": 8, "hidden_act": "silu", "max_position_embeddings": 32768,
                  "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False,
                  "vocab_size": 32768}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_random_llama(tmp_path_factory.mktemp("hf") / "random-llama", seed=0)


@pytest.fixture(scope="module")
def hf_model(folder):
    from transformers import LlamaForCausalLM
    return LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.mark.parametrize("cfg", [LLAMA_32_1B, TINYLLAMA, SMOLLM2_135M, MISTRAL_7B_V03],
                         ids=["llama-3.2-1b", "tinyllama", "smollm2-135m", "mistral-7b-v0.3"])
def test_published_llama_family_configs_are_accepted(cfg):
    c = config_from_hf(cfg)
    assert (c.d_model, c.n_layers, c.n_heads, c.n_kv_heads) == (cfg["hidden_size"], cfg["num_hidden_layers"],
                                                                 cfg["num_attention_heads"], cfg["num_key_value_heads"])
    assert c.tie_embeddings == cfg["tie_word_embeddings"] and c.rope_theta == cfg.get("rope_theta", 10_000.0)


def test_llama3_rope_scaling_is_read_in_both_spellings():
    legacy = config_from_hf(LLAMA_32_1B)
    params = {k: v for k, v in LLAMA_32_1B.items() if k not in ("rope_theta", "rope_scaling")}
    v5 = config_from_hf({**params, "rope_parameters": {**LLAMA_32_1B["rope_scaling"], "rope_theta": 500000.0}})
    old_key = config_from_hf({**LLAMA_32_1B, "rope_scaling": {**LLAMA_32_1B["rope_scaling"], "type": "llama3"}})
    assert legacy == v5 == old_key
    assert legacy.rope_scaling == Llama3RopeScaling(32.0, 1.0, 4.0, 8192) and legacy.rope_theta == 500000.0


@pytest.mark.parametrize("change, field", [
    ({"attention_bias": True}, "attention_bias"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"model_type": "mistral", "sliding_window": 4096}, "sliding_window"),
    ({"num_local_experts": 8, "num_experts_per_tok": 2}, "num_local_experts"),
    ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type"),
    ({"rope_scaling": None, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
     "rope_parameters.rope_type"),
    ({"head_dim": 128}, "head_dim"),
    ({"model_type": "qwen2"}, "model_type"),
    ({"architectures": ["GemmaForCausalLM"]}, "architectures"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
])
def test_unsupported_configs_are_refused_naming_the_field(change, field):
    with pytest.raises(UnsupportedModel, match=f"config.json: {field}="):
        config_from_hf({**LLAMA_32_1B, **change})


def test_a_refused_folder_fails_before_reading_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**TINYLLAMA, "attention_bias": True}))
    with pytest.raises(UnsupportedModel, match="attention_bias"):
        load_model(tmp_path)


def test_logits_match_transformers(folder, hf_model):
    model = load_model(folder)
    assert model.config.rope_scaling is not None and not model.config.tie_embeddings
    g = torch.Generator().manual_seed(1)
    for length in (1, 7, 64, 250):          # past the 32-token original context of the rope scaling
        x = torch.randint(0, model.config.vocab_size, (2, length), generator=g)
        with torch.inference_mode():
            err = (model(x) - hf_model(x).logits).abs().max().item()
        assert err < LOGIT_TOL, f"{length} tokens: max |logit difference| {err:.2e} >= {LOGIT_TOL}"


def test_tokenizer_matches_transformers(folder):
    from transformers import AutoTokenizer

    ours, theirs = tokenizer_for(folder), AutoTokenizer.from_pretrained(folder)
    assert isinstance(ours, HFTokenizer) and stop_token_ids(ours) == (1, 2)
    for text in ["def add(a, b):\n    return a + b\n", "Ünïcödé ✓ 你好, 世界 🙂", "  spaces\t\ttabs\n\n", "<|eot_id|>x"]:
        ids = ours.encode(text, disallowed_special=())
        assert ids == theirs(text)["input_ids"], text
        assert ours.decode_bytes(ids) == text.replace("<|eot_id|>", "").encode(), text   # special tokens: no text


def test_course_tokenizer_keeps_its_interface():
    enc = tokenizer_for("target")
    assert enc is load_tokenizer() and stop_token_ids(enc) == (enc.eot_token,)
    assert chat_template_for(enc) is PLAIN_CHAT


def test_chat_template_renders_like_transformers(folder):
    from transformers import AutoTokenizer

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    text = AutoTokenizer.from_pretrained(folder).apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ours = chat_template_for(tokenizer_for(folder)).render(messages)
    assert "<|begin_of_text|>" + ours == text            # the BOS comes from encoding, not from the text


def test_sentencepiece_style_tokenizer_detokenizes_byte_exactly():
    """Llama 2 / TinyLlama / Mistral layout: "▁" for spaces, "<0xNN>" byte-fallback tokens for unknown characters."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in ["▁", "H", "e", "l", "o", "w", "r", "d"]:
        vocab[piece] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    ours = HFTokenizer(tok, eos_token_ids=[2])
    text = "Hello wörld ✓"
    ids = ours.encode(text)
    assert any(3 <= i < 259 for i in ids), "the test text must need byte-fallback tokens"
    assert tok.decode(ids) == text
    assert ours.decode_bytes(ids) == b" " + text.encode()      # the leading "▁" is a space mid-text; HF strips it at the start
    pieces = b"".join(ours.decode_bytes([i]) for i in ids)       # one token at a time: the same bytes
    assert pieces == b" " + text.encode()
