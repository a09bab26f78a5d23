"""The local reply that was handed to the remote model part-way, kept above the remote's answer.

When the escalator stops a local reply because the local model is out of its depth, the text it
had written is not the answer, but silently replacing it would hide what happened (and make the
remote's first tokens look like they continue it). It folds into this block, titled with the
reason, and the remote's answer streams below it. It is display only: the history keeps the
remote's reply, and the remote never sees this text.
"""

from __future__ import annotations

from textual.widgets import Collapsible, Static


def superseded_title(reason: str) -> str:
    return f"Local reply superseded · {reason}" if reason else "Local reply superseded"


class SupersededReply(Collapsible):
    """A collapsed, dimmed copy of a local partial reply (plain text: it may stop mid-construct)."""

    DEFAULT_CSS = """
    SupersededReply { border: none; padding: 0; margin: 0 0 1 0; background: transparent; }
    SupersededReply > Contents { padding: 0 0 0 2; }
    SupersededReply .superseded-text { color: $text-muted; text-style: strike; }
    """

    def __init__(self, text: str, reason: str = "") -> None:
        super().__init__(Static(text, markup=False, classes="superseded-text"),
                         title=superseded_title(reason), collapsed=True)
        self.text = text

    def __repr__(self) -> str:
        return f"<SupersededReply {'collapsed' if self.collapsed else 'open'} {len(self.text)} chars>"
