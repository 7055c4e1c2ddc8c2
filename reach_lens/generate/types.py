"""What an engine is asked for and what it returns: ``Request``, ``LoglikRequest``, ``Generation``.

    req = Request(prompt=(1, 2, 3), max_new_tokens=8, temperature=0.8, seed=17, route=(0, 1, 1, 2))
    gen = engine.generate([req])[0]        # Generation: tokens, text, token log-probs, entropies, ...
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch import Tensor

from reach_lens.errors import UserError
from reach_lens.routes import LayerRoute

TokenIds = tuple[int, ...]  # a prompt or continuation as token ids


class EngineCapabilityError(UserError, ValueError):
    """A request needs something (hooks, routes, hidden states, log-likelihoods) this engine cannot do."""


@dataclass(frozen=True)
class Request:
    """One continuation to generate.

    - ``prompt``: token ids (BOS included when the model wants one).
    - ``route``: the layers run, in order (``None``: the full path ``0..L-1``); skips and repeats allowed,
      a repeated layer has its own KV-cache entries.
    - ``temperature`` 0 is greedy (argmax); above 0 the row samples from softmax(logits / T) with its own
      generator seeded by ``seed`` (required), so its tokens depend on (model, prompt, route, T, top_p, seed) only;
      ``top_p`` < 1 samples from the nucleus: the most probable tokens whose tempered mass reaches ``top_p``.
    - A row ends at a token of ``stop_token_ids`` (``None``: the tokenizer's EOS; ``()``: none), at the first
      of ``stop_strings`` in its decoded continuation, or after ``max_new_tokens``.
    - ``keep_hidden``: also return the residual stream entering ``ln_final`` at the position whose logits
      chose the last token (``Generation.hidden``, ``[d_model]``).
    """

    prompt: TokenIds
    max_new_tokens: int
    route: LayerRoute | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_strings: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] | None = None
    keep_hidden: bool = False

    def __post_init__(self):
        object.__setattr__(self, "prompt", tuple(int(t) for t in self.prompt))
        if self.route is not None:
            object.__setattr__(self, "route", tuple(self.route))
        object.__setattr__(self, "stop_strings", tuple(s for s in self.stop_strings if s))
        if self.stop_token_ids is not None:
            object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if not self.prompt:
            raise ValueError("prompt is empty: every prompt needs at least one token")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens {self.max_new_tokens} out of range: expected >= 1")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature {self.temperature} out of range: expected a finite value >= 0")
        if self.temperature > 0 and self.seed is None:
            raise ValueError(f"temperature {self.temperature} samples: pass a seed")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p {self.top_p} out of range: expected 0 < top_p <= 1")


@dataclass(frozen=True)
class LoglikRequest:
    """The summed log-probability of ``continuation`` (token ids) after ``context`` (token ids, non-empty)."""

    context: TokenIds
    continuation: TokenIds

    def __post_init__(self):
        object.__setattr__(self, "context", tuple(int(t) for t in self.context))
        object.__setattr__(self, "continuation", tuple(int(t) for t in self.continuation))
        if not self.context:
            raise ValueError("empty context: no token predicts the first continuation token")
        if not self.continuation:
            raise ValueError("empty continuation: nothing to score")


@dataclass(frozen=True)
class Generation:
    """One generated continuation.

    ``tokens`` are the new tokens, including the one that ended the row (EOS, or the token completing a stop
    string). ``token_logprobs[t]`` / ``token_entropies[t]`` are the log-probability of ``tokens[t]`` and the
    entropy (nats) of the model's *untempered* next-token distribution (temperature 1), whatever temperature
    chose the token. ``finish_reason`` is "eos", "stop" (a stop string) or "length" (the budget). ``text`` is the
    decoded continuation cut before the first stop string (None without a decoder). ``route`` is the route it ran
    under (None: the full path); ``hidden`` is filled when asked (``Request.keep_hidden``).
    """

    tokens: list[int]
    token_logprobs: list[float]
    token_entropies: list[float]
    finish_reason: str
    text: str | None
    route: LayerRoute | None = None
    hidden: Tensor | None = field(default=None, compare=False)

    @property
    def mean_logprob(self) -> float:
        """Mean token log-probability (untempered)."""
        return sum(self.token_logprobs) / len(self.token_logprobs)

    @property
    def entropy(self) -> float:
        """Mean over steps of the untempered next-token entropy (nats)."""
        return sum(self.token_entropies) / len(self.token_entropies)
