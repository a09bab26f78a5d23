"""Sampling a reply's tokens: the sampler (``sampler``: penalties, greedy or llama.cpp's chain),
how sure the model was of each token (``confidence``), and constrained sampling beside it:
llama.cpp's grammar engine over the vocabulary (``grammar``), the table that narrows a redraw by
first bytes (``lead_bytes``) and a turn's grammar judging each token (``constrained``).

What a grammar is and where in the reply it applies is ``formats.constraint``; the sampler only
asks its :class:`~localchat.engine.sampling.sampler.TokenJudge`.
"""
