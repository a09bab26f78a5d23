"""A completion's prompt as tokens (``layout.RawPrompt``), built with the loaded model's
vocabulary on the scheduler thread just before its turn (``ChatRequest.prompt``): text or token
ids (``/v1/completions``), a fill-in-the-middle gap laid with the model's own FIM tokens
(``suffix``, ``/infill``), Ollama's ``/api/generate`` (raw, or through the chat template, after
the ``context`` a previous reply returned).

The fill-in-the-middle layout is llama-server's (``format_prompt_infill`` in tools/server): the
extra chunks first (``fim_rep`` and a project name, then ``fim_sep`` and a file name before
each, or a plain separator for a model without those), so that they stay cached while the user
types, then ``fim_pre`` prefix prompt ``fim_suf`` suffix ``fim_mid``. ``/infill`` also takes
llama-server's budget: the prefix's last 3/4 of a batch, the suffix's first quarter less the
prompt, the extra chunks' last tokens up to the context less a batch and twice the reply. One
deliberate difference: the BOS of a model that wants one opens the context, before the chunks
(llama-server puts it after them, where no model saw one in training).

Every problem the client caused is a 400 naming the field: token ids outside the vocabulary
(with its size), a gap asked of a model without FIM tokens (naming the model), a prompt that
does not fit the context (naming the limit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from localchat.engine.engine import Engine
from localchat.engine.layout import RawPrompt
from localchat.engine.vocabulary import FimTokens, Vocabulary
from localchat.serve.fields import shown
from localchat.serve.http_errors import BadRequest, bad

# llama-server's separator before each extra chunk when the model has no fim_sep token.
SNIPPET = "\n\n--- snippet ---\n\n"
PROJECT = "myproject\n"  # llama-server's project name after fim_rep (not an input there either)
CURRENT_FILE = "filename\n"  # and the current file's


def token_ids(value: Any, param: str) -> tuple[int, ...]:
    """A JSON array of token ids (non-negative integers), or a 400 naming the first that is not."""
    if not isinstance(value, list):
        raise bad(param, f"must be an array of token ids, not {shown(value)}")
    for i, token in enumerate(value):
        if not isinstance(token, int) or isinstance(token, bool) or token < 0:
            raise bad(f"{param}[{i}]", f"must be a token id (an integer >= 0), not {shown(token)}")
    return tuple(value)


def _in_vocabulary(ids: Sequence[int], vocabulary: Vocabulary, param: str) -> list[int]:
    for i, token in enumerate(ids):
        if token >= vocabulary.size:
            raise bad(f"{param}[{i}]", f"is token id {token}, outside the model's vocabulary of "
                                       f"{vocabulary.size} tokens (ids 0 to {vocabulary.size - 1})")
    return list(ids)


def _fitting(tokens: list[int], engine: Engine, param: str, verbatim: bool = True) -> RawPrompt:
    if not tokens:
        raise bad(param, "is empty: there is nothing to complete")
    if len(tokens) >= engine.n_ctx:
        raise bad(param, f"is {len(tokens)} tokens, over the model's context of {engine.n_ctx} "
                         "tokens (n_ctx; the reply needs room too): send a shorter prompt")
    return RawPrompt(tuple(tokens), verbatim)


def _fim(vocabulary: Vocabulary, model: str, param: str) -> FimTokens:
    fim = vocabulary.fim()
    if not fim.complete:
        raise BadRequest(f"{param}: model {model!r} has no fill-in-the-middle tokens (its GGUF "
                         "names no tokenizer.ggml.fim_pre/suf/mid_token_id, and llama.cpp knows "
                         "none by their text); use a code model trained for it, such as "
                         "qwen2.5-coder-1.5b", param)
    return fim


def _gap(fim: FimTokens, prefix: list[int], suffix: list[int]) -> list[int]:
    """``fim_pre`` prefix ``fim_suf`` suffix ``fim_mid``: the reply is the middle."""
    assert fim.pre is not None and fim.suf is not None and fim.mid is not None
    return [fim.pre, *prefix, fim.suf, *suffix, fim.mid]


@dataclass(frozen=True)
class TextPrompt:
    """``/v1/completions``' prompt: ``text`` (special tokens written in it are special, BOS
    added if the model wants one) or token ``ids`` as they are; with a ``suffix``, the text is
    the prefix of a gap to fill."""

    text: str | None = None
    ids: tuple[int, ...] | None = None
    suffix: str | None = None

    def build(self, engine: Engine, model: str) -> RawPrompt:
        vocabulary = engine.vocabulary
        if self.suffix is not None:
            fim = _fim(vocabulary, model, "suffix")
            prefix = (_in_vocabulary(self.ids, vocabulary, "prompt") if self.ids is not None
                      else vocabulary.tokenize(self.text or "", special=False))
            suffix = vocabulary.tokenize(self.suffix, special=False)
            return _fitting([*vocabulary.bos, *_gap(fim, prefix, suffix)], engine, "prompt")
        if self.ids is not None:
            return _fitting(_in_vocabulary(self.ids, vocabulary, "prompt"), engine, "prompt")
        text = vocabulary.tokenize(self.text or "", special=True)
        return _fitting([*vocabulary.bos, *text] if text else [], engine, "prompt")


@dataclass(frozen=True)
class InfillPrompt:
    """llama-server's ``/infill``: the gap between ``prefix`` and ``suffix``, the reply going on
    from ``prompt`` (text typed before the cursor, after the prefix), after the ``extra``
    chunks (``(filename, text)``: other files, recent edits)."""

    prefix: str
    suffix: str
    extra: tuple[tuple[str, str], ...] = ()
    prompt: str = ""
    n_predict: int = -1  # the reply's budget (-1: none given), for the extra chunks' share

    def build(self, engine: Engine, model: str) -> RawPrompt:
        vocabulary = engine.vocabulary
        fim = _fim(vocabulary, model, "model")
        n_batch, n_ctx = engine.options.n_batch, engine.n_ctx
        prefix = vocabulary.tokenize(self.prefix, special=False)
        suffix = vocabulary.tokenize(self.suffix, special=False)
        prompt = vocabulary.tokenize(self.prompt, special=True)
        extra = self._chunks(vocabulary, fim)
        take_prefix = min(len(prefix), 3 * (n_batch // 4))
        take_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
        take_extra = min(max(0, n_ctx - n_batch - 2 * max(0, self.n_predict)), len(extra))
        tokens = [*vocabulary.bos, *extra[len(extra) - take_extra:],
                  *_gap(fim, [*prefix[len(prefix) - take_prefix:], *prompt], suffix[:take_suffix])]
        return _fitting(tokens, engine, "input_extra")

    def _chunks(self, vocabulary: Vocabulary, fim: FimTokens) -> list[int]:
        def text(value: str) -> list[int]:
            return vocabulary.tokenize(value, special=False)

        tokens = [fim.rep, *text(PROJECT)] if fim.rep is not None else []
        for filename, chunk in self.extra:
            tokens += [fim.sep, *text(filename + "\n")] if fim.sep is not None else text(SNIPPET)
            tokens += text(chunk)
        if fim.sep is not None:
            tokens += [fim.sep, *text(CURRENT_FILE)]
        return tokens


@dataclass(frozen=True)
class GeneratePrompt:
    """Ollama's ``/api/generate``: ``prompt`` through the chat template as a user message (after
    ``system``), or as it is with ``raw``, or the prefix of a gap before ``suffix``; all after
    ``context`` (the tokens a previous reply returned: the conversation goes on from there)."""

    prompt: str
    suffix: str | None = None
    raw: bool = False
    system: str | None = None
    context: tuple[int, ...] = ()

    def build(self, engine: Engine, model: str) -> RawPrompt:
        vocabulary = engine.vocabulary
        before = _in_vocabulary(self.context, vocabulary, "context")
        opening = [] if before else vocabulary.bos
        if self.suffix is not None:
            fim = _fim(vocabulary, model, "suffix")
            gap = _gap(fim, vocabulary.tokenize(self.prompt, special=False),
                       vocabulary.tokenize(self.suffix, special=False))
            return _fitting([*before, *opening, *gap], engine, "prompt")
        if self.raw:
            text = vocabulary.tokenize(self.prompt, special=True)
            return _fitting([*before, *opening, *text], engine, "prompt")
        messages = [{"role": "system", "content": self.system}] if self.system else []
        rendered = engine.fresh_prompt([*messages, {"role": "user", "content": self.prompt}])
        if before and vocabulary.bos and rendered[:1] == vocabulary.bos:
            rendered = rendered[1:]  # the context opened with it already
        return _fitting([*before, *rendered], engine, "prompt", verbatim=False)
