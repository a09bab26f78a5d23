"""The context as data: what the model is shown of a conversation, and the token budget.

- ``chat_context``: ``ChatContext``, the conversation over one engine (history, summary, the window
  the model sees) and ``send``; a turn that may leave the engine goes through a ``TurnRouter``.
- ``message``: ``Message``, one entry of the history; ``turn_engine``: ``TurnEngine``, what the
  context needs from an engine.
- ``budget``: plain planning over exact token counts: what to trim and when to summarize.
- ``oversized_message``: one message too long for even an empty context: refused or cut head and tail.
- ``keeper``: applies the budget to a live ``ChatContext`` and its engine; ``draft``: prefilling while typing.
- ``factory``: a ``ChatContext`` wired to a real engine with the user's ``[context]`` settings.

Arrows point one way: ``factory`` imports ``chat_context``, which imports ``keeper`` and
``draft``; ``keeper`` imports ``budget``, which imports ``oversized_message``; ``message`` and
``turn_engine`` import nothing of ``context/``. A part that needs something of its owner
declares it as a small Protocol (``keeper.ConversationWindow``, ``draft.DraftHost``,
``oversized_message.OverlongSettings``) instead of importing the owner.

Above ``engine/``; knows no remote, no store and no UI (``chat/`` wires those in).

One word per idea: a *session* is a stored conversation (``store/``, ``--session``); a
``ChatContext`` is what the model is shown of it; a ``chat.Conversation`` joins the two.
"""
