"""Parallel slots: several conversations decoded together in one llama.cpp context.

``parallel.ParallelEngine`` runs each turn on a slot (a sequence id of one shared cache) and a
thread of its own; ``gate.DecodeGate`` makes the decodes of every slot taking part one
llama_decode call (continuous batching: a request joins the running batch at the next step);
``slot_runtime.SlotRuntime`` is the runtime a slot's turn sees; ``choice`` picks the slot whose
cells keep the most of a new request.
"""
