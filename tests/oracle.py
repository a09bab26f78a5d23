"""The exactness oracle for anything that touches the KV cache.

A greedy reply that reuses cached cells must equal the greedy reply of an engine that prefills
the same visible history from nothing. One thing besides a cache bug changes greedy tokens:
llama.cpp's CPU kernels round differently for different batch shapes (a reply decoded one token
at a time vs. the same tokens prefilled in one batch). Measured on the test model: the same 81
tokens evaluated as 24+1×23+18+1×16 or as one batch give logits up to 0.98 apart (max abs over
the vocabulary), which flipped a greedy near-tie whose margin was 0.16 logits. So where the two
replies differ, the oracle looks at the fresh engine's logits at the first differing token
(teacher-forced on the cached reply up to there): it must be a near-tie, never a clear preference.
Wrong cells (e.g. rotated into place) give garbage at once, with margins of several logits.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from localchat.context.chat_context import ChatContext
from localchat.engine.engine import Engine
from localchat.engine.fresh import fresh_logits
from localchat.engine.layout import RawPrompt
from localchat.engine.options import EngineOptions, Sampling
from localchat.events import Done, Token

N_COMPARED = 24
GREEDY = Sampling(temperature=0.0, repeat_penalty=1.0, max_tokens=N_COMPARED)
# Largest logit margin at the first differing token that batch-shape rounding may explain.
NEAR_TIE = 0.5


@contextmanager
def loaded_engine(model: Path, n_ctx: int, name: str, **options) -> Iterator[Engine]:
    """A CPU engine on ``model``, loaded, closed afterwards (for module-scoped fixtures)."""
    engine = Engine(model, EngineOptions(n_ctx=n_ctx, gpu_layers=0, **options), name=name)
    engine.load()
    try:
        yield engine
    finally:
        engine.close()


def reply_tokens(handle) -> tuple[list[int], Done]:
    tokens, final = [], None
    for event in handle:
        if isinstance(event, Token):
            tokens.append(event.token_id)
        final = event
    assert isinstance(final, Done), final
    return tokens, final


def fresh_reply(oracle: Engine, messages: list[dict], n_tokens: int = N_COMPARED,
                sampling: Sampling = GREEDY) -> list[int]:
    """The first ``n_tokens`` of the greedy reply to ``messages`` on an empty cache
    (``sampling``: greedy with other settings, a constraint say)."""
    oracle.reset()
    wanted = replace(sampling, max_tokens=max(N_COMPARED, n_tokens))
    tokens, _ = reply_tokens(oracle.submit(messages, wanted))
    oracle.reset()
    return tokens[:n_tokens]


def assert_matches_fresh(cached: list[int], oracle: Engine, messages: list[dict],
                         sampling: Sampling = GREEDY) -> None:
    """``cached`` (a greedy reply's first tokens) is what a fresh prefill of ``messages`` gives,
    up to a near-tie flipped by batch-shape rounding."""
    fresh = fresh_reply(oracle, messages, len(cached), sampling)
    if fresh == cached:
        return
    i = next((k for k, (a, b) in enumerate(zip(cached, fresh)) if a != b), min(len(cached), len(fresh)))
    assert i < min(len(cached), len(fresh)), f"replies differ in length: {cached} vs {fresh}"
    logits = oracle.fresh_logits(messages, cached[:i], sampling=sampling)
    margin = float(logits[fresh[i]] - logits[cached[i]])
    assert margin < NEAR_TIE, (
        f"reply differs from a fresh prefill at token {i}: the fresh engine prefers "
        f"{fresh[i]} over {cached[i]} by {margin:.3f} logits (cached {cached}, fresh {fresh})")


def take_back_last_exchange(chat: ChatContext) -> str:
    """What ``/retry`` does to the model's history: cut it before the last prompt (the TUI sets
    that exchange aside as a branch and rewinds the session there); returns the prompt."""
    last = max(i for i, m in enumerate(chat.history) if m.role == "user")
    text = chat.history[last].content
    chat.rewind(last)
    return text


def assert_text_matches_fresh(text: str, oracle: Engine, messages: list[dict] | RawPrompt,
                              sampling: Sampling = GREEDY) -> None:
    """``text`` (a greedy reply read through an API, which gives text, not token ids) is what a
    fresh prefill of ``messages`` (or of a prompt given as tokens) gives, up to a near-tie: where
    the texts part, the fresh engine's top-2 margin at that token must be under NEAR_TIE."""
    oracle.reset()
    tokens, pieces = [], []
    turn = (oracle.submit_prompt(messages, sampling) if isinstance(messages, RawPrompt)
            else oracle.submit(messages, sampling))
    for event in turn:
        if isinstance(event, Token):
            tokens.append(event.token_id)
            pieces.append(event.text)
    oracle.reset()
    if "".join(pieces) == text:
        return
    shown, i = "", 0
    while i < len(pieces) and text.startswith(shown + pieces[i]):
        shown += pieces[i]
        i += 1
    if isinstance(messages, RawPrompt):
        prompt = list(messages.tokens)
        logits = oracle.with_cache(lambda kv: fresh_logits(kv, prompt, tokens[:i], None, 128))
    else:
        logits = oracle.fresh_logits(messages, tokens[:i])
    best, second = sorted(float(x) for x in logits[logits.argsort()[-2:]])[::-1]
    assert best - second < NEAR_TIE, (
        f"reply differs from a fresh prefill after {shown!r}: the fresh engine's choice there "
        f"leads by {best - second:.3f} logits (served {text!r}, fresh {''.join(pieces)!r})")
