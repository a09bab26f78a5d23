"""The loaded model's tokens as a prompt given as tokens needs them (``Engine.vocabulary``): its
size, text to tokens with or without special tokens and BOS, and its special tokens for
fill-in-the-middle as llama.cpp reads them (``llama_vocab_fim_pre`` and the rest: the GGUF's
``tokenizer.ggml.fim_*_token_id``, or tokens llama.cpp recognises by their text).

Safe from any thread: it only reads the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

from localchat.engine.runtime import LlamaRuntime

FIM_KINDS = ("pre", "suf", "mid", "pad", "rep", "sep")


@dataclass(frozen=True)
class FimTokens:
    """A model's fill-in-the-middle tokens (None: it has none of that kind). ``pre``, ``suf``
    and ``mid`` lay out one file's gap; ``rep`` and ``sep`` name a repository and its files
    (Qwen2.5-Coder's repository-level layout)."""

    pre: int | None = None
    suf: int | None = None
    mid: int | None = None
    pad: int | None = None
    rep: int | None = None
    sep: int | None = None

    @property
    def complete(self) -> bool:
        """Whether a gap can be laid out (prefix, suffix and middle tokens all present)."""
        return None not in (self.pre, self.suf, self.mid)


class Vocabulary:
    """The tokens of ``runtime``'s model."""

    def __init__(self, runtime: LlamaRuntime) -> None:
        self._runtime = runtime

    def __repr__(self) -> str:
        return f"<Vocabulary of {self.size} tokens>"

    @property
    def size(self) -> int:
        return self._runtime.n_vocab

    @property
    def bos(self) -> list[int]:
        """The BOS token if the model wants one at the start of a context (else nothing)."""
        return [self._runtime.bos_id] if self._runtime.add_bos and self._runtime.bos_id >= 0 else []

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        """Tokens of ``text`` (no BOS); ``special``: special tokens written in it become
        special tokens (a prompt), else they stay text (code a user edits)."""
        return self._runtime.model.tokenize(text.encode("utf-8"), False, special)

    def fim(self) -> FimTokens:
        ids = {kind: self._runtime.fim_token(kind) for kind in FIM_KINDS}
        return FimTokens(**{kind: (token if token >= 0 else None) for kind, token in ids.items()})
