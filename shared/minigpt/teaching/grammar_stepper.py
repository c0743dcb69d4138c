"""A grammar stepper (lab 10): constrained decoding one token at a time, with the mask and the model side by side.

    from minigpt.teaching.grammar_stepper import GrammarStepper
    GrammarStepper(model, enc, schema=SHIRT, prompt="The shirt, as JSON: ")     # shows itself as a cell's last value

Edit the JSON schema and the prompt, press Compile (a schema the compiler refuses is shown in red, not raised), then
Step (one token) or Run to end. After each step the view shows the text so far (and, in grey, the text the grammar
forces next), the automaton's state (its stacks, its forced text, whether it accepts), how many tokens the mask
allows, and the next choice: the model's top tokens without the mask (each marked allowed or not) and the top allowed
tokens renormalised, with the probability mass the mask removed. Greedy by default; "sample" draws at temperature 1
from the renormalised distribution, seeded (changing either starts over, as Reset does).

`GrammarRun` is the decoding (no widgets): the next token's logits and mask are computed right after each token is
taken, so the readout always describes the choice the next step makes. `next_choice` and `stepper_html` are pure.
"""

from __future__ import annotations

import html
import json
import time
from dataclasses import dataclass
from typing import Any

import ipywidgets as W
import torch
from torch import Tensor

from minigpt.cache.contiguous import KVCache
from minigpt.model import GPT
from minigpt.sampling import SamplingParams, make_generator, sample_next
from minigpt.structured.grammar import Grammar, State
from minigpt.structured.json_schema import compile_json_schema
from minigpt.structured.token_cache import ContextCache
from minigpt.structured.token_masks import TokenTrie, Vocabulary

__all__ = ["TokenRow", "NextChoice", "next_choice", "GrammarRun", "stepper_html", "GrammarStepper"]

TOP = 8
FINISHED = {"end": "the model chose end-of-text", "length": "the token limit was reached",
            "no token": "the mask allowed no token"}


@dataclass(frozen=True)
class TokenRow:
    token: int
    label: str                  # the token's text as shown (special tokens by name)
    p: float                    # the model's probability, no mask
    allowed: bool
    p_renormalised: float       # p / (allowed mass) for an allowed token, 0 otherwise


@dataclass(frozen=True)
class NextChoice:
    """What the next step chooses from."""
    model_top: list[TokenRow]           # the model's most likely tokens, allowed or not
    allowed_top: list[TokenRow]         # the most likely allowed tokens
    allowed_count: int
    vocab_size: int
    removed_mass: float                 # the probability of the tokens the mask refuses


def token_label(tokenizer: Any, token: int) -> str:
    """A token's text; bytes that are not whole UTF-8 characters as \\x escapes."""
    return tokenizer.decode_single_token_bytes(token).decode("utf-8", errors="backslashreplace")


def next_choice(logits: Tensor, allowed: Tensor, tokenizer: Any, top: int = TOP) -> NextChoice:
    """The model's top tokens and the mask's top tokens from one row of logits (V,) and a (V,) bool mask."""
    probs = torch.softmax(logits.float().cpu(), dim=-1)
    allowed = allowed.cpu()
    kept = probs * allowed
    mass = float(kept.sum())
    renormalised = kept / mass if mass > 0 else kept

    def rows(scores: Tensor, k: int) -> list[TokenRow]:
        return [TokenRow(t, token_label(tokenizer, t), float(probs[t]), bool(allowed[t]), float(renormalised[t]))
                for t in torch.topk(scores, k).indices.tolist()]

    n_allowed = int(allowed.sum())
    return NextChoice(rows(probs, min(top, len(probs))),
                      rows(torch.where(allowed, probs, -1.0), min(top, n_allowed)),
                      n_allowed, len(probs), 1.0 - mass)


class GrammarRun:
    """One constrained generation after `prompt`, a token a `step()`, with a KV cache: the prompt is prefilled at
    construction, and each token taken goes through the model at once, so `logits` and `allowed` are always those
    of the next choice. `finished` is None while it runs, then a key of FINISHED."""

    def __init__(self, model: GPT, prompt: list[int], grammar: Grammar, masks: ContextCache, *,
                 max_new_tokens: int, sampling: SamplingParams) -> None:
        if not prompt:
            raise ValueError("type a prompt: the model needs at least one token to start from")
        room = model.config.max_seq_len - len(prompt)
        if room < 1:
            raise ValueError(f"the prompt has {len(prompt)} tokens; the model's context is {model.config.max_seq_len}")
        self.model, self.grammar, self.masks, self.sampling = model, grammar, masks, sampling
        self.vocab: Vocabulary = masks.trie.vocab
        self.max_new_tokens = min(max_new_tokens, room)
        self.generator = make_generator(sampling, model.device)
        self.cache = KVCache.for_model(model, 1, max_seq_len=len(prompt) + self.max_new_tokens)
        self.prompt = list(prompt)
        self.tokens: list[int] = []
        self.no_choice: list[bool] = []             # per token: the mask allowed it alone
        self.state: State | None = grammar.start_state()
        self.finished: str | None = None
        self.model_ms = self.mask_ms = 0.0          # the last step's costs
        self._look_ahead(self.prompt)

    @property
    def text(self) -> str:
        return "".join(self.vocab.texts[t] or "\ufffd" for t in self.tokens)

    @property
    def accepted(self) -> bool:
        return self.grammar.accepting(self.state)

    @torch.inference_mode()
    def _look_ahead(self, new: list[int]) -> None:
        """Run `new` through the model and mask the next token from the current state."""
        t0 = time.perf_counter()
        x = torch.tensor([new], device=self.model.device)
        self.logits = self.model(x, positions=self.cache.next_positions(len(new)), kv_caches=self.cache)[0, -1].float()
        t1 = time.perf_counter()
        self.allowed = self.masks.mask(self.state)
        t2 = time.perf_counter()
        self.model_ms, self.mask_ms = (t1 - t0) * 1e3, (t2 - t1) * 1e3
        if not self.allowed.any():
            self.finished = "no token"

    def step(self) -> int | None:
        """Take one token (the end-of-text token ends the run); None once finished."""
        if self.finished:
            return None
        masked = self.logits.masked_fill(~self.allowed.to(self.logits.device), float("-inf"))
        token = int(sample_next(masked[None], self.sampling, self.generator))
        if token == self.vocab.eos_id:
            self.finished = "end"
            return token
        self.tokens.append(token)
        self.no_choice.append(int(self.allowed.sum()) == 1)
        self.state = self.grammar.walk(self.state, self.vocab.texts[token])
        if len(self.tokens) >= self.max_new_tokens:
            self.finished = "length"
        else:
            self._look_ahead([token])
        return token

    def run_to_end(self) -> None:
        while not self.finished:
            self.step()


def _p(x: float) -> str:
    return "0" if x == 0 else f"{x:.1e}" if x < 1e-3 else f"{x:.3f}"


def _mask_word(allowed: bool) -> str:
    return "allowed" if allowed else "refused"


def _rows_html(rows: list[TokenRow], *, renormalised: bool) -> str:
    head = ("<tr><th>token</th><th>p (model)</th><th>p (renormalised)</th></tr>" if renormalised else
            "<tr><th>token</th><th>p (model)</th><th>mask</th></tr>")
    body = "".join(
        f"<tr style='background:{'#c8f7c5' if r.allowed else '#f7c5c5'}'><td><code>{html.escape(repr(r.label))}</code>"
        f"</td><td>{_p(r.p)}</td><td>{_p(r.p_renormalised) if renormalised else _mask_word(r.allowed)}</td></tr>"
        for r in rows)
    return f"<table>{head}{body}</table>"


def _verdict(run: GrammarRun) -> str:
    if not run.finished:
        return f"<b>after {len(run.tokens)} of at most {run.max_new_tokens} tokens</b>"
    if run.accepted:
        try:
            json.loads(run.text)
            parses = "it parses as JSON"
        except ValueError:
            parses = "json.loads refuses it"
        return (f"<b>finished after {len(run.tokens)} tokens ({FINISHED[run.finished]}): "
                f"<span style='color:#070'>the grammar accepts the document</span></b>; {parses}")
    return (f"<b>finished after {len(run.tokens)} tokens ({FINISHED[run.finished]}): "
            f"<span style='color:#b00'>the document is incomplete (the grammar does not accept it)</span></b>")


def stepper_html(run: GrammarRun, prompt_text: str, choice: NextChoice | None) -> str:
    """The readout: verdict, text so far (the last token highlighted, the forced continuation in grey), the
    automaton's state, and (while running) the next choice's tables."""
    pieces = []
    for i, (token, alone) in enumerate(zip(run.tokens, run.no_choice)):
        style = "background:#c8f7c5" if i == len(run.tokens) - 1 else "background:#dde4ff" if alone else ""
        pieces.append(f"<span style='{style}'>{html.escape(run.vocab.texts[token] or '')}</span>")
    forced = run.grammar.forced_text(run.state) if run.state is not None else ""
    ahead = "" if run.finished else forced
    text = (f"<pre style='white-space:pre-wrap'><span style='color:#777'>{html.escape(prompt_text)}</span>"
            f"{''.join(pieces)}<span style='color:#999;font-style:italic'>{html.escape(ahead)}</span></pre>"
            "<div style='font-size:85%'>green: the last token; blue: a token that was the only one allowed; "
            "grey italic: the text the grammar forces next</div>")
    stacks = len(run.state) if run.state is not None else 0
    forced_note = f"<code>{html.escape(repr(forced))}</code>" if forced else "none (the next character is a choice)"
    state = (f"automaton: {stacks} stack{'s' if stacks != 1 else ''}; forced text here: {forced_note}; "
             f"accepts here: <b>{'yes' if run.accepted else 'no'}</b>")
    parts = [f"<div>{_verdict(run)}</div>", text, f"<div>{state}</div>"]
    if choice is not None and not run.finished:
        parts.append(
            f"<div>next token: <b>{choice.allowed_count:,} of {choice.vocab_size:,}</b> tokens allowed; "
            f"the mask removes <b>{choice.removed_mass:.3f}</b> of the model's probability "
            f"and keeps {_p(1 - choice.removed_mass)}. "
            f"Last step: forward {run.model_ms:.1f} ms, mask {run.mask_ms:.1f} ms.</div>"
            f"<div style='display:flex;gap:2em'><div>model's top {len(choice.model_top)}, no mask"
            f"{_rows_html(choice.model_top, renormalised=False)}</div><div>top {len(choice.allowed_top)} allowed, "
            f"renormalised{_rows_html(choice.allowed_top, renormalised=True)}</div></div>")
    return "".join(parts)


class GrammarStepper:
    """Schema and prompt in, Compile, then Step / Run to end / Reset over one constrained generation."""

    def __init__(self, model: GPT, tokenizer: Any, *, schema: dict[str, Any], prompt: str, max_new_tokens: int = 64,
                 trie: TokenTrie | None = None, top: int = TOP) -> None:
        """`trie`: a `TokenTrie` of `tokenizer`'s vocabulary to share (built here otherwise, about a second)."""
        self.model, self.tokenizer, self.max_new_tokens, self.top = model, tokenizer, max_new_tokens, top
        self.trie = trie or TokenTrie(Vocabulary.from_tokenizer(tokenizer))
        self.grammar: Grammar | None = None
        self.masks: ContextCache | None = None
        self.run: GrammarRun | None = None
        wide = {"description_width": "initial"}
        # The two boxes send their text when it is committed (focus leaves, or Enter in the prompt), and a committed
        # text recompiles / starts over by itself: a browser sends a button's click at once but may hold a box's
        # text back until the kernel is idle, so a click alone could compile the previous text.
        self.schema = W.Textarea(value=json.dumps(schema, indent=2), description="JSON schema", rows=12,
                                 continuous_update=False, style=wide, layout=W.Layout(width="60%"))
        self.prompt = W.Text(value=prompt, description="prompt", continuous_update=False, style=wide,
                             layout=W.Layout(width="60%"))
        self.sample = W.Checkbox(value=False, description="sample (temperature 1)", indent=False, style=wide)
        self.seed = W.BoundedIntText(value=0, min=0, max=2**31 - 1, description="seed", style=wide,
                                     layout=W.Layout(width="10em"))
        self.compile_button = W.Button(description="Compile", button_style="primary")
        self.step_button = W.Button(description="Step")
        self.run_button = W.Button(description="Run to end")
        self.reset_button = W.Button(description="Reset")
        self.error = W.HTML()
        self.readout = W.HTML()
        self.compile_button.on_click(lambda _: self.compile())
        self.step_button.on_click(lambda _: self.step())
        self.run_button.on_click(lambda _: self.run_to_end())
        self.reset_button.on_click(lambda _: self.reset())
        self.schema.observe(lambda _: self.compile(), names="value")
        self.prompt.observe(lambda _: self.reset(), names="value")
        self.sample.observe(lambda _: self.reset(), names="value")
        self.seed.observe(lambda _: self.reset(), names="value")
        self.widget = W.VBox([self.schema, self.prompt,
                              W.HBox([self.compile_button, self.step_button, self.run_button, self.reset_button,
                                      self.sample, self.seed]),
                              self.error, self.readout])
        self.compile()

    def compile(self) -> None:
        """Compile the schema as typed and start over; a refused schema is shown, the previous run dropped."""
        self.grammar = self.masks = self.run = None
        try:
            schema = json.loads(self.schema.value)
            if not isinstance(schema, dict):
                raise ValueError(f"a schema is a JSON object, got {type(schema).__name__}")
            grammar = compile_json_schema(schema)
        except Exception as err:         # the learner's input: any failure is reported in the view, never raised
            self._show_error("the schema does not compile", err)
            return
        self.grammar, self.masks = grammar, ContextCache(grammar, self.trie)
        self.reset()

    def reset(self) -> None:
        """Back to the start with the compiled grammar, the prompt as typed, and the sampling settings."""
        if self.grammar is None:
            return
        sampling = SamplingParams(temperature=1.0, seed=self.seed.value) if self.sample.value else SamplingParams()
        try:
            prompt = self.tokenizer.encode(self.prompt.value)
            self.run = GrammarRun(self.model, prompt, self.grammar, self.masks, max_new_tokens=self.max_new_tokens,
                                  sampling=sampling)
        except ValueError as err:        # an empty or too long prompt, or one holding a special token's text
            self.run = None
            self._show_error("cannot start", err)
            return
        self.error.value = ""
        self._render()

    def step(self) -> None:
        if self.run is not None:
            self.run.step()
            self._render()

    def run_to_end(self) -> None:
        if self.run is not None:
            self.run.run_to_end()
            self._render()

    def choice(self) -> NextChoice | None:
        """The next step's choice (None when there is no run or it is finished)."""
        if self.run is None or self.run.finished:
            return None
        return next_choice(self.run.logits, self.run.allowed, self.tokenizer, self.top)

    def _render(self) -> None:
        running = self.run is not None and not self.run.finished
        self.step_button.disabled = self.run_button.disabled = not running
        self.reset_button.disabled = self.run is None
        if self.run is not None:
            self.readout.value = stepper_html(self.run, self.tokenizer.decode(self.run.prompt), self.choice())

    def _show_error(self, what: str, err: Exception) -> None:
        self.error.value = (f"<span style='color:#b00'>{html.escape(what)}: {html.escape(type(err).__name__)}: "
                            f"{html.escape(str(err))}</span>")
        self.readout.value = ""
        self.step_button.disabled = self.run_button.disabled = True
        self.reset_button.disabled = self.grammar is None          # a prompt to fix: Reset reads it again

    def _repr_mimebundle_(self, **kwargs):  # display the widget when the object is a cell's last expression
        return self.widget._repr_mimebundle_(**kwargs)
