"""A stand-in engine that streams a fixed reply at a set speed, for measuring what the app does
with replies the test model would never write (2,000 tokens of Markdown with code, lists and
tables). No model is loaded and its thread sleeps between tokens, so what is measured is the
app's side. It implements the app's engine protocols (``tui.app_engine.AppEngine``): its
"tokenizer" is the token-sized pieces below, and its "KV cache" holds the last turn's pieces, as
a record the context keeper and the snapshots can read.

``one_paragraph`` and ``many_blocks`` are the reply shapes ``bench --tui`` (and the proof tests
in tests/test_tui_stream.py) stream; ``store_conversation`` is the long conversation one of them
is sent below.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localchat.engine.layout import CachedMessage
from localchat.engine.snapshot_file import KVSnapshot
from localchat.engine.turn import TurnHandle
from localchat.events import Done, Loaded, PrefillProgress, RouteChanged, Timings, Token

if TYPE_CHECKING:
    from localchat.store import Store
    from localchat.tui.app_engine import AppEngine

# Pieces of up to 4 characters, a leading space kept: about the size of a BPE token, so that a
# reply arrives at the characters per second of a real model at the same tokens per second.
_PIECE = re.compile(r" ?[^\s]{1,4}|\s+")


def split_pieces(text: str) -> list[str]:
    """Token-sized pieces whose concatenation is ``text``."""
    return _PIECE.findall(text)


def one_paragraph(tokens: int) -> str:
    """The numbers 1, 2, 3, … as one paragraph of about ``tokens`` tokens (what the test model
    writes for the bench's prompt)."""
    count = max(1, tokens // 2)
    while True:
        text = ", ".join(str(n) for n in range(1, count + 1))
        short = tokens - len(split_pieces(text))
        if short <= 0:
            return text + "."
        count += max(1, short // 2)


def many_blocks(tokens: int) -> str:
    """About ``tokens`` tokens of sections: a heading, a paragraph with inline code, emphasis and
    a link, a code fence, a bullet list and a table."""
    parts: list[str] = []
    section = 0
    while sum(len(split_pieces(p)) for p in parts) < tokens:
        section += 1
        parts += [
            f"## Part {section}",
            f"Some prose about **part {section}** that goes on for a while, with `inline code`, "
            f"*emphasis* and a [link](https://example.org/{section}) " + "and more words " * 6 + ".",
            "```python\n" + "\n".join(f"def f{section}_{k}(x):\n    return x * {k}  # times {k}"
                                      for k in range(3)) + "\n```",
            "\n".join(f"- item {k} of list {section}, with *some* `code`" for k in range(4)),
            "| n | square | cube |\n|---|---|---|\n"
            + "\n".join(f"| {k} | {k * k} | {k ** 3} |" for k in range(4)),
        ]
    return "\n\n".join(parts)


STORED_REPLY = ("Here is one way to do it.\n\n- parse the input with `json.loads`\n- check each field\n"
                "- write it back\n\n```python\ndef rewrite(text):\n    return json.dumps(json.loads(text))\n```\n\n"
                "That keeps the keys in order and fails loudly on bad input, which is what you want here.")


def store_conversation(store: Store, exchanges: int, model: str) -> None:
    """A new session in ``store`` (its newest) of ``exchanges`` prompts, each answered by
    ``STORED_REPLY``: a paragraph, a list and a code block."""
    session = store.create_session(model=model)
    for n in range(exchanges):
        store.add_exchange(session.id, f"Question {n}: how would you write this?", STORED_REPLY, model=model)


class ScriptedEngine:
    """Streams ``reply`` in token-sized pieces, one every ``tpot_s`` seconds, for every turn;
    ``on_token(index)`` is called as each is emitted (on the engine's thread)."""

    supports_thinking = False
    can_trim_in_place = True
    TEMPLATE_TOKENS = 4  # around each message, as a chat template would

    def __init__(self, reply: str, tpot_s: float = 0.0125, *, name: str = "scripted",
                 on_token: Callable[[int], None] | None = None, n_ctx: int = 32768,
                 route: str = "local") -> None:
        self.name = name
        self.route = route  # "remote": each reply is handed over (RouteChanged) before its first token
        self.model_path = Path(f"{name}.gguf")
        self.n_params: int | None = None
        self.n_ctx = n_ctx
        self.reply = reply
        self.tpot_s = tpot_s
        self.on_token = on_token
        self.info: Loaded | None = None
        self._lock = threading.Lock()
        self._records: list[CachedMessage] = []
        self._pieces: dict[str, int] = {"": 0}

    def __repr__(self) -> str:
        return f"ScriptedEngine({self.name!r}, {len(self.reply)} chars, tpot {self.tpot_s * 1000:.1f} ms)"

    def load(self, on_progress: Callable[[float], None] | None = None) -> Loaded:
        if on_progress:
            on_progress(1.0)
        self.info = Loaded(self.name, self.n_ctx, 0, 0, "CPU")
        return self.info

    def preflight(self) -> None:
        """Nothing to check: there is no file."""

    # -- the "tokenizer" and the "KV cache" ------------------------------------------------------

    def count_tokens(self, text: str) -> int:
        return len(split_pieces(text))

    def tokenize(self, text: str) -> list[int]:
        with self._lock:
            return [self._pieces.setdefault(piece, len(self._pieces)) for piece in split_pieces(text)]

    def detokenize(self, tokens: list[int]) -> str:
        with self._lock:
            names = {token: piece for piece, token in self._pieces.items()}
        return "".join(names.get(token, "") for token in tokens)

    def template_overhead(self) -> int:
        return self.TEMPLATE_TOKENS

    def prompt_tokens(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> int:
        return sum(self.count_tokens(m["content"]) + self.TEMPLATE_TOKENS for m in messages)

    @property
    def tokens_in_context(self) -> int:
        with self._lock:
            return sum(len(r.tokens) for r in self._records)

    def cached_messages(self) -> list[CachedMessage]:
        with self._lock:
            return list(self._records)

    def fingerprint(self) -> dict[str, Any]:
        return {"model": self.name, "n_ctx": self.n_ctx}

    def export_snapshot(self) -> KVSnapshot:
        records = self.cached_messages()
        return KVSnapshot(records, b"", sum(len(r.tokens) for r in records))

    def import_snapshot(self, snapshot: KVSnapshot) -> float:
        with self._lock:
            self._records = list(snapshot.records)
        return 0.0

    def reset(self) -> None:
        with self._lock:
            self._records = []

    # -- turns -----------------------------------------------------------------------------------

    def submit(self, messages: list[dict[str, str]], sampling: object = None, *,
               background: bool = False) -> TurnHandle:
        """Every turn streams the reply (a background one, a summary, ends at once)."""
        stopped = threading.Event()
        handle = TurnHandle(on_stop=lambda _handle: stopped.set())
        if background:
            handle.emit(Done("", "stop", Timings()))
            return handle
        threading.Thread(target=self._stream, args=(messages, handle, stopped), daemon=True,
                         name="scripted-engine").start()
        return handle

    def prepare(self, messages: list[dict[str, str]],
                tools: tuple[dict[str, Any], ...] = ()) -> TurnHandle:
        """Nothing to precompute."""
        handle = TurnHandle()
        handle.emit(Done("", "stop", Timings()))
        return handle

    def stop(self) -> None:
        """Turns stop through their handles."""

    def close(self) -> None:
        """Nothing to release."""

    def _stream(self, messages: list[dict[str, str]], handle: TurnHandle, stopped: threading.Event) -> None:
        started = handle.submitted_at
        prompt_n = self.prompt_tokens(messages)
        handle.emit(PrefillProgress(prompt_n, prompt_n))
        if self.route == "remote":
            handle.emit(RouteChanged("remote", f"asking {self.name}-remote: scripted"))
        pieces, sent = split_pieces(self.reply), []
        next_at = time.perf_counter()
        for index, piece in enumerate(pieces):
            next_at += self.tpot_s
            delay = next_at - time.perf_counter()
            if delay > 0 and stopped.wait(delay) or stopped.is_set():
                break
            sent.append(time.perf_counter())
            if self.on_token is not None:
                self.on_token(index)
            handle.emit(Token(piece, token_id=index))
        reply = "".join(pieces[:len(sent)])
        self._remember(messages, reply)
        decode_ms = (sent[-1] - sent[0]) * 1000 if len(sent) > 1 else 0.0
        timings = Timings(prompt_n=prompt_n, predicted_n=len(sent),
                          ttft_ms=(sent[0] - started) * 1000 if sent else 0.0,
                          tpot_ms=decode_ms / (len(sent) - 1) if len(sent) > 1 else 0.0,
                          predicted_ms=decode_ms, n_ctx=self.n_ctx, n_ctx_used=self.tokens_in_context,
                          model=self.name, route=self.route)
        handle.emit(Done(reply, "aborted" if stopped.is_set() else "stop", timings))

    def _remember(self, messages: list[dict[str, str]], reply: str) -> None:
        records = [CachedMessage(m["role"], m["content"], "", self.tokenize(m["content"]) + [0] * self.TEMPLATE_TOKENS)
                   for m in messages]
        records.append(CachedMessage("assistant", reply, "", self.tokenize(reply), open=True))
        with self._lock:
            self._records = records


if TYPE_CHECKING:
    def _is_an_app_engine(engine: ScriptedEngine) -> AppEngine:
        """mypy's proof that the scripted engine implements every engine protocol of the app."""
        return engine
