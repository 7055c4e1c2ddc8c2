"""Token choice and stop checks of the generation loop.

Token choice: greedy rows take the argmax; a sampling row draws one uniform number per step from its own
``torch.Generator`` (seeded from its request's seed) and inverts the CDF of softmax(logits / T) in float64
(restricted to the nucleus of mass ``top_p`` when that is below 1),
so its tokens are a function of (model, prompt, route, T, seed) only: not of the batch it runs in, its
slot, or which other rows exist (up to float rounding of the logits themselves, which varies with a batch's
shape and can flip a near-tie).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import torch
from jaxtyping import Float
from torch import Tensor


class NonFiniteLogits(FloatingPointError):
    """The model produced NaN or infinite logits (typically a hook wrote non-finite values into the residual);
    ``request`` is the index of the first request concerned in the engine call (None when unknown)."""

    def __init__(self, message: str, request: int | None = None):
        super().__init__(message)
        self.request = request


def row_seed(seed: int, sample: int) -> int:
    """The generator seed of sample ``sample`` of a prompt whose seed is ``seed`` (a stable 63-bit hash)."""
    digest = hashlib.sha256(f"{seed}/{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def check_finite(logits: Float[Tensor, "rows d_vocab"], requests: Sequence[int], describe: Callable[[int], str]) -> None:
    """Raise ``NonFiniteLogits`` for the first row whose logits hold NaN or +-inf, naming its request
    (``requests[row]``, described by ``describe(request)``)."""
    finite = torch.isfinite(logits).all(-1)
    if not bool(finite.all()):
        request = requests[int((~finite).nonzero()[0, 0])]
        raise NonFiniteLogits(f"non-finite logits for {describe(request)}: the model produced NaN or inf (a hook may "
                              "have written non-finite values into its activations)", request=request)


def nucleus(probs: Float[Tensor, "rows d_vocab"], top_p: Float[Tensor, "rows"]) -> Float[Tensor, "rows d_vocab"]:
    """``probs`` with every token outside each row's nucleus zeroed: the most probable tokens, in order, until their
    mass reaches ``top_p`` (the token that crosses it included, so the most probable one always stays)."""
    ordered, order = probs.sort(dim=-1, descending=True)
    outside = (ordered.cumsum(-1) - ordered) >= top_p[:, None]
    return probs.masked_fill(outside.scatter(-1, order, outside), 0.0)


def choose(logits: Float[Tensor, "rows d_vocab"], temperatures: Sequence[float],
           generators: Sequence[torch.Generator | None],
           top_ps: Sequence[float] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Chosen tokens, their untempered log-probabilities and the untempered entropies, each ``[rows]`` (CPU).

    Row ``r`` is greedy when ``temperatures[r] == 0``, else it samples with ``generators[r]``, from the nucleus of
    mass ``top_ps[r]`` when that is below 1 (default: every row 1, the whole distribution).
    """
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    tokens = logits.argmax(-1)
    sampled = [r for r, t in enumerate(temperatures) if t > 0]
    if sampled:
        index = torch.tensor(sampled, device=logits.device)
        temps = torch.tensor([temperatures[r] for r in sampled], dtype=logits.dtype, device=logits.device)
        probs = torch.softmax(logits[index] / temps[:, None], dim=-1).double()
        cut = [i for i, r in enumerate(sampled) if top_ps is not None and top_ps[r] < 1]
        if cut:  # rows at top_p 1 keep their exact distribution
            p = torch.tensor([top_ps[sampled[i]] for i in cut], dtype=probs.dtype, device=probs.device)
            probs[cut] = nucleus(probs[cut], p)
        cdf = probs.cumsum(-1)
        u = torch.stack([torch.rand((), generator=generators[r], dtype=torch.float64, device=generators[r].device)
                         for r in sampled]).to(cdf.device)
        drawn = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0].clamp_(max=logits.shape[-1] - 1)
        tokens[index] = drawn
    chosen = logp.gather(-1, tokens[:, None])[:, 0]
    return tokens.cpu(), chosen.cpu(), entropy.cpu()


class StopCheck:
    """Ends a row at a stop token, at a stop string in its decoded continuation, or at its length budget."""

    def __init__(self, stop_token_ids: Sequence[int], stop_strings: Sequence[str],
                 decode: Callable[[list[int]], str] | None, max_new_tokens: int):
        self.stop_ids = set(stop_token_ids)
        self.stop_strings = tuple(s for s in stop_strings if s)
        if self.stop_strings and decode is None:
            raise ValueError("stop_strings need a decoder (the model has no tokenizer)")
        self.decode = decode
        self.max_new_tokens = max_new_tokens
        # a stop string of c characters spans at most 4c byte-level tokens; the margin covers decoders that drop
        # a leading space of their first token
        self.window = 4 * max((len(s) for s in self.stop_strings), default=0) + 8

    def __call__(self, tokens: list[int]) -> tuple[str | None, str | None]:
        """(finish reason or None, text cut before the first stop string, when finished and decodable)."""
        if tokens[-1] in self.stop_ids:
            return "eos", self._text(tokens)
        if self.stop_strings:
            tail = self.decode(tokens[-self.window:])
            if any(s in tail for s in self.stop_strings):
                text = self.decode(tokens)
                cuts = [text.find(s) for s in self.stop_strings if s in text]
                if cuts:
                    return "stop", text[: min(cuts)]
        if len(tokens) >= self.max_new_tokens:
            return "length", self._text(tokens)
        return None, None

    def _text(self, tokens: list[int]) -> str | None:
        return None if self.decode is None else self.decode(tokens)
