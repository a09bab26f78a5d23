"""llama.cpp's grammar engine, as one turn uses it: whether a GBNF text parses, and for a loaded
model's vocabulary whether a token may come next (one token, or a whole candidate array at once).

llama.cpp gives a NULL sampler for a grammar it cannot parse (llama-cpp-python does not check),
and it aborts the process when a token the grammar rejects is accepted into it, or an end of
generation before the grammar is complete. So every grammar is parsed here first, a refusal is a
one-line FormatError in llama.cpp's own words, and ``accept`` is only ever called with a token
``allows`` said yes to (``sampling.constrained`` keeps to that).
"""

from __future__ import annotations

import contextlib
import ctypes
import re
from collections.abc import Iterator

import numpy as np

from localchat.engine.llama_log import llama_messages
from localchat.errors import FormatError

# llama_token_data as a numpy record: a candidate array is made from the logits without a
# Python loop (262,144 entries for the largest vocabularies).
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def check_grammar(text: str, root: str = "root", vocab=None) -> None:
    """FormatError unless llama.cpp parses the GBNF ``text`` with the start rule ``root``.
    Without a ``vocab`` (before a model is loaded) a token named by its text (``<|im_end|>``)
    cannot be looked up: it is left for the check against the loaded model's vocabulary."""
    import llama_cpp

    sampler, said = _init(llama_cpp, vocab, text, root)
    if sampler:
        llama_cpp.llama_sampler_free(sampler)
        return
    if vocab is None and any("no vocab to parse token" in line for line in said):
        return
    raise FormatError(_refusal(said, root))


class Grammar:
    """A grammar over a loaded model's vocabulary, from its start: what may come next, and
    what came (``accept``)."""

    def __init__(self, vocab, text: str, root: str = "root") -> None:
        import llama_cpp

        self._lib = llama_cpp
        sampler, said = _init(llama_cpp, vocab, text, root)
        if not sampler:
            raise FormatError(_refusal(said, root))
        self._sampler = sampler
        self._one = np.zeros(1, dtype=TOKEN_DATA)
        self._single = llama_cpp.llama_token_data_array(
            self._one.ctypes.data_as(llama_cpp.llama_token_data_p), 1, -1, False)

    def allows(self, token: int) -> bool:
        """Whether ``token`` may come next (an end of generation: whether the grammar is
        complete). One candidate checked: a few microseconds."""
        one = self._one
        one[0] = (token, 0.0, 0.0)
        self._single.size, self._single.selected = 1, -1
        self._lib.llama_sampler_apply(self._sampler, ctypes.byref(self._single))
        return bool(one["logit"][0] != -np.inf)

    def mask(self, candidates: np.ndarray) -> None:
        """Set the logit of every candidate the grammar rejects to -inf (``candidates``: a
        contiguous TOKEN_DATA array; llama.cpp decodes each token's text in C)."""
        lib = self._lib
        array = lib.llama_token_data_array(
            candidates.ctypes.data_as(lib.llama_token_data_p), len(candidates), -1, False)
        lib.llama_sampler_apply(self._sampler, ctypes.byref(array))

    def accept(self, token: int) -> None:
        """``token`` came next (one ``allows`` said yes to; never an end of generation)."""
        self._lib.llama_sampler_accept(self._sampler, token)

    @contextlib.contextmanager
    def copy(self) -> Iterator[Grammar]:
        """A copy in the same state, to try tokens on without changing this one (~80 us)."""
        clone = Grammar.__new__(Grammar)
        clone._lib, clone._sampler = self._lib, self._lib.llama_sampler_clone(self._sampler)
        clone._one = np.zeros(1, dtype=TOKEN_DATA)
        clone._single = self._lib.llama_token_data_array(
            clone._one.ctypes.data_as(self._lib.llama_token_data_p), 1, -1, False)
        try:
            yield clone
        finally:
            clone.close()

    def restart(self) -> None:
        """Back to the grammar's start."""
        self._lib.llama_sampler_reset(self._sampler)

    def close(self) -> None:
        if self._sampler:
            self._lib.llama_sampler_free(self._sampler)
            self._sampler = None


def _init(llama_cpp, vocab, text: str, root: str):
    """llama.cpp's grammar sampler for ``text`` (NULL when it refuses it), and what it said."""
    with llama_messages() as said:
        sampler = llama_cpp.llama_sampler_init_grammar(vocab, text.encode("utf-8"),
                                                       root.encode("utf-8"))
    return sampler, said


def _refusal(said: list[str], root: str) -> str:
    """llama.cpp's reason for refusing a grammar, in one line."""
    for i, line in enumerate(said):
        found = re.search(r"error parsing grammar: (.*)", line)
        if found:
            reason = found.group(1).strip()
            if reason.endswith(" at"):  # llama.cpp prints where on the lines after
                where = next((rest.strip() for rest in said[i + 1:] if rest.strip()), "")
                reason += f" {where[:40]!r}" if where else " the end"
            return f"the grammar does not parse: {reason}"
    for line in said:
        if "left recursion" in line:
            return ("the grammar does not parse: a rule begins with itself (left recursion, "
                    "which llama.cpp refuses); write the repetition with * or + instead")
        if "does not contain" in line:
            return f"the grammar has no start rule {root!r} (write it as: {root} ::= ...)"
    detail = next((line for line in said if line), "")
    return "the grammar does not parse" + (f": {detail}" if detail else "")
