"""Export a course model as a Hugging Face Llama folder: `python -m minigpt.export target OUT_DIR`.

    export_hf("target", "out/minigpt-target")     # config.json, model.safetensors, generation_config.json,
                                                  # tokenizer.json, tokenizer_config.json
    LlamaForCausalLM.from_pretrained("out/minigpt-target"); AutoTokenizer.from_pretrained("out/minigpt-target")

The weights keep the checkpoint's bf16 values (renamed by `minigpt.hf.weights`, nothing permuted), so
`load_model(OUT_DIR)` gives the same logits as `load_model("target")`. The tokenizer.json is the course's
tiktoken BPE rebuilt with the `tokenizers` library (`course_tokenizer`): the same split regex, GPT-2's
byte alphabet, the ranks as the vocabulary and, for every token, the ways it splits into two lower-ranked
tokens as merges in rank order; `ignore_merges` looks a whole chunk up first, as tiktoken does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from minigpt.checkpoint import STORAGE_DTYPE, load_card, load_model
from minigpt.hf.config import config_to_hf
from minigpt.hf.tokenizer import byte_to_unicode
from minigpt.hf.weights import course_to_hf
from minigpt.model import GPT
from minigpt.paths import data_dir
from minigpt.serving.chat_template import CHAT_STOP, ROLE_NAMES
from minigpt.tokenizer import EOT, EOT_ID, SPLIT_PATTERN, TOKENIZER_FILE, read_ranks

__all__ = ["course_tokenizer", "export_hf", "to_transformers", "main", "PLAIN_CHAT_JINJA"]

# The course's plain-text chat (minigpt.serving.chat_template.render_chat) as a jinja template.
PLAIN_CHAT_JINJA = (
    "{% set names = " + json.dumps(ROLE_NAMES) + " %}"
    "{% for m in messages %}{% if not loop.first %}{{ '\\n\\n' }}{% endif %}"
    "{{ names[m['role']] }}: {{ m['content'] | trim }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '\\n\\nAssistant:' }}{% endif %}")


def course_tokenizer(rank_file: Path | None = None):
    """The course BPE as a `tokenizers.Tokenizer` encoding every text to the same ids as `load_tokenizer()`."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    ranks = read_ranks(rank_file or data_dir() / "tokenizer" / TOKENIZER_FILE)
    alphabet = byte_to_unicode()

    def spell(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    merges: list[tuple[str, str]] = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        splits = [(token[:i], token[i:]) for i in range(1, len(token))
                  if ranks.get(token[:i], rank) < rank and ranks.get(token[i:], rank) < rank]
        splits.sort(key=lambda pair: (ranks[pair[0]], ranks[pair[1]]))
        merges += [(spell(a), spell(b)) for a, b in splits]
    tok = Tokenizer(models.BPE(vocab={spell(t): r for t, r in ranks.items()}, merges=merges, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOT, special=True, normalized=False)])
    if tok.token_to_id(EOT) != EOT_ID:
        raise RuntimeError(f"{EOT} got id {tok.token_to_id(EOT)}, expected {EOT_ID}")
    return tok


def export_hf(name: str | Path, out_dir: str | Path) -> Path:
    """Write the course checkpoint `name` ("target", "draft" or a .safetensors path) as an HF Llama folder."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = load_model(name, dtype=STORAGE_DTYPE)
    cfg = model.config
    state = {course_to_hf(k): v.detach().contiguous() for k, v in model.state_dict().items()
             if not (cfg.tie_embeddings and k == "lm_head.weight")}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    card = load_card(name)
    config = {**config_to_hf(cfg, eos_token_id=EOT_ID, bos_token_id=EOT_ID, dtype="bfloat16"),
              "transformers_version": _transformers_version()}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": EOT_ID, "eos_token_id": EOT_ID, "transformers_version": config["transformers_version"]},
        indent=2) + "\n")
    course_tokenizer().save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": EOT, "eos_token": EOT, "unk_token": None,
        "model_max_length": cfg.max_seq_len, "clean_up_tokenization_spaces": False, "add_bos_token": False,
        "chat_template": PLAIN_CHAT_JINJA}, indent=2) + "\n")
    (out / "README.md").write_text(
        f"# minigpt {Path(str(name)).stem}\n\nThe course's {Path(str(name)).stem} model ({card.get('parameters', '?')} "
        f"parameters, trained on the course corpus), exported by `python -m minigpt.export`. A Llama: "
        f"load it with `LlamaForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained`. Chat replies "
        f"stop at {EOT!r} or at the text {CHAT_STOP!r}.\n")
    return out


def to_transformers(model: GPT, *, attn_implementation: str = "sdpa"):
    """A transformers `LlamaForCausalLM` holding the same weights as `model` (same dtype and device), in memory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = model.config
    hf_cfg = LlamaConfig(**config_to_hf(cfg, eos_token_id=EOT_ID, bos_token_id=EOT_ID, dtype=str(model.dtype)[6:]),
                         attn_implementation=attn_implementation)
    with torch.device(model.device):
        hf = LlamaForCausalLM(hf_cfg).to(model.dtype)       # its random init is overwritten just below
    state = {course_to_hf(k): v.detach() for k, v in model.state_dict().items()
             if not (cfg.tie_embeddings and k == "lm_head.weight")}
    hf.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_embeddings:
        hf.tie_weights()
    hf.generation_config.eos_token_id = EOT_ID
    return hf.eval()


def _transformers_version() -> str:
    try:
        import transformers
        return transformers.__version__
    except ImportError:
        return "5.23.0"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minigpt.export", description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", help="course checkpoint: target, draft or a .safetensors path")
    ap.add_argument("out_dir", type=Path)
    a = ap.parse_args(argv)
    out = export_hf(a.checkpoint, a.out_dir)
    print(f"wrote {out}: " + ", ".join(sorted(p.name for p in out.iterdir())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
