"""Bringing the KV cache to a turn's layout: the one place that decides which cells a turn
reuses and which it prefills.

``fill_cache`` applies the layout's trim shift, keeps the longest prefix of cells that may be
reused, and prefills the rest through ``ConversationCache``. Reuse is exact: outside the
conversation a trim shift was made for, a cell is reused only if it was computed in order from
exactly the tokens before it now (``ConversationCache.exact_n``), so a reply that reuses the cache
equals the reply after a fresh prefill of the same history.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from localchat.engine.image_records import image_safe_cut
from localchat.engine.kv import ConversationCache
from localchat.engine.layout import PROMPT, CachedMessage, Layout
from localchat.engine.runtime import DecodeAborted
from localchat.events import Timings


def fill_cache(kv: ConversationCache, layout: Layout, timings: Timings, *, chunk: int,
               should_stop: Callable[[], bool], on_progress: Callable[[int, int], None],
               needs_logits: bool = True) -> bool:
    """Bring ``kv`` to ``layout``, prefilling ``chunk`` tokens per llama_decode call, and note in
    ``timings`` what was reused, shifted and prefilled. ``needs_logits``: the last prompt token
    is evaluated even if cached (a turn samples from its logits; a draft prefill does not).

    Returns False if ``should_stop`` ended the prefill: the cache then holds what it evaluated,
    the stopped message as a partial record (or exactly what it held before, if nothing was
    added). Any other failure forgets the cache, so it is never used while wrong."""
    timings.prefix_fallback = layout.prefix_fallback
    if layout.shift is not None:
        current = kv.shift(layout.shift)
        timings.trimmed_n = layout.shift.end - layout.shift.start
        timings.context_shift = True
    else:
        current = kv.tokens()
    target = layout.tokens
    reused = _common_prefix(current, target)
    if not layout.continues:
        # Another conversation, a /retry or an edit: equal token ids are not enough, only
        # cells computed in order from exactly these tokens may be reused.
        reused = min(reused, kv.exact_n)
    if reused == len(target) and needs_logits:
        reused -= 1  # the last prompt token must be evaluated to get logits to sample from
    wanted = image_safe_cut(target, reused)  # a picture's cells are kept whole or not at all
    reused = kv.truncate(wanted)  # fewer when the memory rolled back to a checkpoint
    # Where this turn starts adding: an edit or a stopped prefill rolls back to here.
    kv.checkpoint()
    timings.cache_n = reused
    timings.rebuild_n += _held_before(kv.records, reused, wanted, layout)
    pending = target[reused:]
    timings.prompt_n += len(pending)
    # If this only appends, a stopped prefill can put the cache back exactly as it was.
    before = kv.mark()
    only_appends = layout.shift is None and reused >= before.n_tokens
    kv.hold(layout.messages)
    # Also just before the last prompt token: a /retry of this turn rolls back there.
    checkpoint_at = len(pending) - 1 if needs_logits and len(pending) > 1 else None
    try:
        kv.prefill(pending, reused, chunk, should_stop, on_progress,
                   checkpoint_at=checkpoint_at if kv.uses_checkpoints else None)
    except DecodeAborted:
        if only_appends and kv.runtime.max_position() + 1 <= before.n_tokens:
            # Stopped before adding a cell: exactly as before (the last reply stays open).
            kv.put_back(before)
        else:
            kv.keep_evaluated()
        return False
    except Exception:
        kv.forget()  # the cache no longer matches its record: start clean, never wrong
        raise
    finally:
        if kv.images is not None:  # the pictures this prefill encoded (cached ones cost none)
            timings.images_n, timings.image_ms = kv.images.images_n, kv.images.image_ms
    return True


def _held_before(records: list[CachedMessage], reused: int, wanted: int, layout: Layout) -> int:
    """Prompt tokens prefilled again although the cache held them: a checkpoint rollback
    (``reused`` < ``wanted``) and, when the conversation goes on but its cells could not be
    kept (a trim on a memory that cannot drop turns, a changed system prompt or summary before
    them), the kept messages after the reuse point."""
    held = Counter((m.role, m.content) for m in records if not m.open)
    again, position = 0, 0
    for message in layout.messages:
        end = position + len(message.tokens)
        key = (message.role, message.content)
        if not message.open and message.role != PROMPT and held[key] > 0:
            held[key] -= 1  # matched once: a later message with the same text is new
            if end > wanted:
                again += end - max(position, wanted)
        position = end
    return again + (wanted - reused)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
