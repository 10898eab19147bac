"""Greedy decoding on a loaded llama.cpp model: prompt tokens, JSON grammar, one step, one sequence."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bridge_assets.llm.backends import chat_messages
from bridge_assets.llm.types import LLMRequest, TokenLogprob

if TYPE_CHECKING:  # imported where used: llama.cpp and numpy load slowly
    import numpy as np
    from llama_cpp import Llama


_CHAT_FORMATTERS: dict[int, Any] = {}  # id(Llama) -> its compiled chat template


def prompt_tokens(model: Llama, request: LLMRequest) -> list[int]:
    """The tokens `create_chat_completion` would feed: the GGUF's own chat template."""
    if id(model) not in _CHAT_FORMATTERS:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        eos, bos = model.token_eos(), model.token_bos()
        _CHAT_FORMATTERS[id(model)] = Jinja2ChatFormatter(
            template=model.metadata["tokenizer.chat_template"],
            eos_token=model._model.token_get_text(eos) if eos != -1 else "",
            bos_token=model._model.token_get_text(bos) if bos != -1 else "", stop_token_ids=[eos])
    prompt = _CHAT_FORMATTERS[id(model)](messages=chat_messages(request))
    return model.tokenize(prompt.prompt.encode("utf-8"), add_bos=not prompt.added_special, special=True)


def forget_chat_template(model: Llama) -> None:
    """Drop the model's compiled chat template (the model is being closed)."""
    _CHAT_FORMATTERS.pop(id(model), None)


# llama-cpp-python's JSON-schema converter lets a string hold any character but `"` and `\`,
# raw line breaks and tabs included, which JSON (and json.loads) forbids: a debate reply quoting
# a chunk's line break was valid for the grammar, rejected when read, and asked again at
# temperature 0 for the same reply (docs/llm-time.md). As in llama.cpp's own converter, the
# string's characters exclude the control characters U+0000-U+001F (escapes stay allowed).
_CONVERTER_CHAR = 'char ::= [^"\\\\] |'
_JSON_CHAR = 'char ::= [^"\\\\\\x00-\\x1F] |'


def json_grammar(schema: dict[str, Any]) -> str:
    """The GBNF grammar of a JSON schema, its strings as JSON defines them."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    lines = json_schema_to_gbnf(json.dumps(schema)).split("\n")
    for i, line in enumerate(lines):
        if line.startswith("char ::="):
            if not line.startswith(_CONVERTER_CHAR):
                raise ValueError(f"llama-cpp-python's JSON grammar has another string rule: {line[:80]}")
            lines[i] = _JSON_CHAR + line[len(_CONVERTER_CHAR):]
    return "\n".join(lines)


class Grammar:
    """A JSON schema's grammar as a llama.cpp sampler, applied by hand in the greedy loop: the
    model's raw distribution gives the log-probabilities, the grammar only picks the token."""

    def __init__(self, model: Llama, schema: dict[str, Any]):
        import ctypes

        import llama_cpp
        from llama_cpp._internals import LlamaTokenDataArray

        self._llama_cpp, self._ctypes = llama_cpp, ctypes
        vocab = llama_cpp.llama_model_get_vocab(model.model)
        self._sampler = llama_cpp.llama_sampler_init_grammar(vocab, json_grammar(schema).encode(), b"root")
        if not self._sampler:
            raise ValueError("llama.cpp could not compile the JSON schema's grammar")
        self._all = LlamaTokenDataArray(n_vocab=model.n_vocab())
        self._one = (llama_cpp.llama_token_data * 1)()
        self._one_array = llama_cpp.llama_token_data_array(data=self._one, size=1, selected=-1, sorted=False)

    def choose(self, logits: np.ndarray) -> int:
        """The most likely token the grammar allows (the greedy token is tried alone first, as
        llama.cpp's own sampler does, because checking the whole vocabulary is slow)."""
        import numpy as np

        token = int(logits.argmax())
        # llama-cpp-python declares the field `id` as ctypes.c_int32; ctypes reads and writes an int
        self._one[0].id, self._one[0].logit, self._one[0].p = token, float(logits[token]), 0.0  # type: ignore[assignment]
        self._one_array.size, self._one_array.selected = 1, -1
        self._llama_cpp.llama_sampler_apply(self._sampler, self._ctypes.byref(self._one_array))
        if np.isfinite(self._one[0].logit):
            return token
        self._all.copy_logits(logits.astype(np.single))
        self._llama_cpp.llama_sampler_apply(self._sampler, self._ctypes.byref(self._all.candidates))
        allowed = self._all.candidates_data.logit
        if not np.isfinite(allowed.max()):
            raise ValueError("the grammar allows no token here")
        return int(self._all.candidates_data.id[int(allowed.argmax())])

    def accept(self, token: int) -> None:
        self._llama_cpp.llama_sampler_accept(self._sampler, token)

    def close(self) -> None:
        self._llama_cpp.llama_sampler_free(self._sampler)


def greedy_step(model: Llama, vocab: Any, logits: np.ndarray, grammar: Grammar | None,
                 top_logprobs: int | None) -> tuple[int | None, TokenLogprob | None]:
    """One greedy token from the last position's logits: argmax, or under a JSON schema the most
    likely token its grammar allows (the grammar then accepts it), and, when asked, its top-k
    log-softmax entry. (None, None) at the end of generation. Both greedy loops use it (one
    sequence, `greedy_with_logprobs`; several, `DecodeLanes`)."""
    import llama_cpp
    import numpy as np

    log_softmax = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))
    token = grammar.choose(logits) if grammar else int(log_softmax.argmax())
    if llama_cpp.llama_vocab_is_eog(vocab, token):
        return None, None
    if grammar:
        grammar.accept(token)
    if top_logprobs is None:
        return token, None
    top = np.argpartition(-log_softmax, top_logprobs)[:top_logprobs]
    top = top[np.argsort(-log_softmax[top])]

    def piece(t: int) -> str:
        return model.detokenize([t], special=False).decode("utf-8", errors="ignore")

    return token, TokenLogprob(token=piece(token), logprob=float(log_softmax[token]),
                               top={piece(int(t)): float(log_softmax[t]) for t in top})


def stopped(text: str, stops: Sequence[str]) -> str | None:
    """`text` cut before the first stop string it holds; None when it holds none."""
    if not any(stop in text for stop in stops):
        return None
    return text[:min(text.index(stop) for stop in stops if stop in text)]


def context_error(tokens: int, max_tokens: int, window: int) -> str | None:
    if tokens + max_tokens > window:
        return f"Requested tokens ({tokens + max_tokens}) exceed context window of {window}"
    return None


def greedy_with_logprobs(model: Llama, request: LLMRequest) -> tuple[str, list[TokenLogprob], int, int]:
    """Greedy decoding that reads the log-probabilities from the last position's logits only.

    Same tokens as llama.cpp's greedy sampler (argmax; under the request's JSON schema, the most
    likely token its grammar allows) and the same top-k log-softmax values of the model's own
    distribution, without `logits_all`; the KV cache of the prefix shared with the previous
    prompt is reused, as llama-cpp-python's own generate() does. Returns text, log-probs,
    tokens in and out.
    """
    import llama_cpp
    import numpy as np

    tokens = prompt_tokens(model, request)
    too_long = context_error(len(tokens), request.max_tokens, model.n_ctx())
    if too_long:
        raise ValueError(too_long)
    vocab = llama_cpp.llama_model_get_vocab(model.model)
    n_vocab = model.n_vocab()
    grammar = Grammar(model, request.json_schema) if request.json_schema is not None else None
    keep = min(model.longest_token_prefix(model._input_ids.tolist(), tokens), len(tokens) - 1)
    model.n_tokens = keep
    model.eval(tokens[keep:])
    generated: list[int] = []
    logprobs: list[TokenLogprob] = []
    text = ""
    try:
        for _ in range(request.max_tokens):
            logits = np.ctypeslib.as_array(model._ctx.get_logits_ith(-1), shape=(n_vocab,)).astype(np.float64)
            token, entry = greedy_step(model, vocab, logits, grammar, request.top_logprobs)
            if token is None:
                break
            if entry is not None:
                logprobs.append(entry)
            generated.append(token)
            text = model.detokenize(generated, special=False).decode("utf-8", errors="ignore")
            cut = stopped(text, request.stop)
            if cut is not None:
                text = cut
                break
            model.eval([token])
    finally:
        if grammar:
            grammar.close()
    return text, logprobs, len(tokens), len(generated)
