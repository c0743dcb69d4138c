"""Token log-probabilities in OpenAI's two formats (lab 08).

    completions (legacy, `logprobs: k`): {"tokens": [str], "token_logprobs": [float], "top_logprobs": [{str: float}],
                                          "text_offset": [int]}   (offsets into the completion text)
    chat (`logprobs: true, top_logprobs: k`): {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}

Values are the model's raw log-probabilities (log_softmax of the logits, before temperature and filtering).
A token's string is its bytes decoded as UTF-8 (a token holding part of a character decodes with U+FFFD; `bytes`
in the chat format keeps the exact bytes).
"""

from __future__ import annotations

from typing import Sequence

from minigpt.serving.outputs import TokenLogprob

__all__ = ["token_bytes", "completion_logprobs", "chat_logprobs"]


def token_bytes(tokenizer: object | None, token_id: int) -> bytes:
    if tokenizer is None:
        return f"token_id:{token_id}".encode()
    return tokenizer.decode_single_token_bytes(token_id)


def _text(tokenizer: object | None, token_id: int) -> str:
    return token_bytes(tokenizer, token_id).decode("utf-8", errors="replace")


def completion_logprobs(tokenizer: object | None, logprobs: Sequence[TokenLogprob], offset: int = 0
                        ) -> tuple[dict, int]:
    """The legacy format for these tokens, their text offsets starting at `offset`; and the offset after them."""
    tokens, offsets = [], []
    for lp in logprobs:
        tokens.append(_text(tokenizer, lp.token_id))
        offsets.append(offset)
        offset += len(tokens[-1])
    top = [{_text(tokenizer, t): v for t, v in lp.top} for lp in logprobs]
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in logprobs], "top_logprobs": top,
            "text_offset": offsets}, offset


def chat_logprobs(tokenizer: object | None, logprobs: Sequence[TokenLogprob]) -> dict:
    def entry(token_id: int, value: float) -> dict:
        raw = token_bytes(tokenizer, token_id)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": value, "bytes": list(raw)}
    return {"content": [{**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
                        for lp in logprobs]}
