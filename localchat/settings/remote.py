"""The ``[remote]`` section of config.toml: :class:`RemoteSettings` is its schema and defaults.

``localchat.settings.load_config`` reads and checks it (types, ranges, the sub-tables
``[remote.router]`` and ``[remote.confidence]``, whose keys may also be written flat in
``[remote]``); the remote client, the breaker and the router take it as it is.

Example::

    [remote]
    mode = "auto"                      # "off" (default) | "ask" | "auto"
    base_url = "http://127.0.0.1:8000/v1"
    model = "qwen2.5-72b-instruct"
    api_key_env = "LOCALCHAT_REMOTE_API_KEY"   # the variable's *name*; its value is never stored
    timeout_s = 30
    images = false                     # true: the remote reads pictures (image_url parts)

The API key is read from the environment when a request is built (:meth:`RemoteSettings.api_key`)
and is never kept on this object, so it cannot end up in a repr, a log line or a file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

Mode = Literal["off", "ask", "auto"]


@dataclass(frozen=True)
class RouterThresholds:
    """When the rules send a prompt to the remote before any local generation (mode ``auto``)."""

    # Sum of the rule weights (see router.py) at or above which a prompt is called hard. None
    # (the default): a function of the local model's parameter count (router.rule_score_for).
    rule_score: float | None = None
    # The prompt is "too long for the local model" above this share of the local room.
    local_fit_fraction: float = 1.0


@dataclass(frozen=True)
class ConfidenceThresholds:
    """When a local reply is stopped and handed to the remote (mode ``auto``)."""

    # The window: confidence is judged over this many tokens that carry numbers (the engine
    # gives them for the reply's first EngineOptions.confidence_tokens, 32 by default).
    min_tokens: int = 16
    # Escalate when the window's mean entropy (nats) is above max_entropy, or its mean top-2
    # margin below min_margin; for other model sizes they are scaled by confidence.scaled().
    # Calibrated on SmolLM2-135M over the two labelled sets (147 prompts, greedy and default
    # sampling, 16-token windows within the first 32 tokens): the start's entropy does not tell
    # hard from easy prompts there (median of the worst window: 1.8 nats hard, 2.2 easy; creative
    # easy prompts such as a haiku run highest), so these fire only on outright guessing: on 0
    # to 3 of the 78 easy prompts per decoding mode (at 3.0 nats: 8 to 10).
    max_entropy: float = 3.75
    min_margin: float = 0.15
    quantile: float = 0.1  # which low quantile of the token probabilities to watch
    # Escalate when that quantile falls below this; 0 (the default) turns the rule off. Over the
    # whole reply at 0.01 it fired only on outright guessing, but the engine now scores just the
    # first 32 tokens, and the p10 of 16 sampled-token probabilities is the second-lowest: at
    # temperature 0.7 one unlucky draw sends an easy reply away (5 of 26 easy held-out prompts,
    # SmolLM2-135M), while entropy and margin describe the distribution, not the draw.
    low_prob: float = 0.0
    escalate_on_length: bool = True  # a reply cut by max_tokens
    escalate_on_loop: bool = True  # a reply stuck repeating itself
    loop_min_chars: int = 48  # a loop must cover at least this many characters...
    loop_min_repeats: int = 3  # ...made of at least this many copies of one unit


@dataclass(frozen=True)
class RemoteSettings:
    """Everything the remote client, the breaker and the router need. Immutable."""

    mode: Mode = "off"
    base_url: str = ""
    model: str = ""
    # The key itself never lives in the config file, only the name of the variable holding it.
    api_key_env: str = "LOCALCHAT_REMOTE_API_KEY"
    timeout_s: float = 30.0  # connect timeout, and the longest silence allowed mid-stream
    # The remote model reads pictures: a message with images may go to it (as OpenAI image_url
    # parts with data: URLs). False: such a turn stays local, and no image bytes are ever sent.
    images: bool = False
    # Budget for the conversation sent to the remote, estimated from characters (see context.py).
    max_context_tokens: int = 8192
    max_tokens: int | None = None  # None: use the local sampling's max_tokens
    breaker_failures: int = 3  # consecutive failed turns that mark the remote down...
    breaker_cooldown_s: float = 120.0  # ...for this long
    router: RouterThresholds = field(default_factory=RouterThresholds)
    confidence: ConfidenceThresholds = field(default_factory=ConfidenceThresholds)

    @property
    def enabled(self) -> bool:
        """True when requests may be made at all: a mode other than "off" and a base URL."""
        return self.mode != "off" and bool(self.base_url)

    @property
    def chat_url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"

    def api_key(self) -> str | None:
        """The key from the environment, read now; None when no variable is named or it is unset."""
        if not self.api_key_env:
            return None
        return os.environ.get(self.api_key_env) or None
