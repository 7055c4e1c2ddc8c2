"""A learned router: per-layer skip/keep/repeat from the prompt's representation, trained on the routes a
search found correct on training questions, cross-fitted so every question's route comes from a router that
never saw that question's search results.

    feats = prompt_features(model, prompt_ids(model, task, questions, fmt))            # [n, d_model]
    found = {q.id: list(zip(t.routes, t.rewards)) for q, t in zip(questions, traces)}  # search results
    routes = cross_fit_routes({q.id: f for q, f in zip(questions, feats)}, found, model.cfg.n_layers)

Labels: a route of the `skip_repeat` space in which every layer runs at most twice is, one to one, a label
per layer: SKIP (0 runs), KEEP (1 run) or REPEAT (2 consecutive runs); the full path is KEEP everywhere.
Routes outside that set (a layer run 3+ times, or layers out of order) have no labels.

Decoding (`decode_route`): a layer's label is the argmax of its 3 probabilities, with ties going to KEEP, so
a layer leaves the full path only when SKIP or REPEAT is strictly more probable than KEEP. Keep dominates the
labels (most layers of most correct routes are kept); the loss does not reweight classes, so the router
intervenes only where the evidence beats that prior. If every layer decodes to SKIP (an empty route), the layer
with the highest KEEP probability is kept.
"""
from __future__ import annotations

import hashlib
import itertools
import operator
from collections.abc import Hashable, Mapping, Sequence
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from reach_lens.routes import LayerRoute, validate_route

SKIP, KEEP, REPEAT = 0, 1, 2
N_ACTIONS = 3
HOST = torch.device("cpu")  # the router is a small host-side model: features and parameters live here, whatever
                            # the transformer's device (its activations are moved here) or torch's default device


def _run_counts(route: Sequence[int], n_layers: int) -> tuple[LayerRoute, np.ndarray]:
    path = validate_route(route, n_layers)
    return path, np.bincount(np.asarray(path, dtype=np.int64), minlength=n_layers).astype(np.int64)


def has_labels(route: Sequence[int], n_layers: int) -> bool:
    """True if `route` (a valid route of an `n_layers`-layer model) is non-decreasing and runs no layer more
    than twice, i.e. has per-layer labels; ValueError if it is not a route at all (empty, layer out of range)."""
    path, counts = _run_counts(route, n_layers)
    return all(a <= b for a, b in itertools.pairwise(path)) and int(counts.max()) <= 2


def route_to_labels(route: Sequence[int], n_layers: int) -> Int[np.ndarray, " n_layers"]:
    """Per-layer labels (SKIP, KEEP, REPEAT = runs of the layer) of a non-decreasing route that runs each
    layer at most twice."""
    path, counts = _run_counts(route, n_layers)
    if not all(a <= b for a, b in itertools.pairwise(path)):
        raise ValueError(f"route {list(path)} is not non-decreasing; only such routes have per-layer labels")
    if int(counts.max()) > 2:
        raise ValueError(f"route {list(path)} runs layer {int(counts.argmax())} {int(counts.max())} times; "
                         f"a per-layer label allows at most 2 (repeat)")
    return counts


def labels_to_route(labels: Sequence[int]) -> LayerRoute:
    """The route running layer l `labels[l]` times (0 SKIP, 1 KEEP, 2 REPEAT), in layer order."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.isin(labels, (SKIP, KEEP, REPEAT)).all():
        raise ValueError(f"labels {labels.tolist()} must be a 1-D sequence of {SKIP} (skip), {KEEP} (keep) "
                         f"or {REPEAT} (repeat)")
    if not labels.any():
        raise ValueError(f"labels {labels.tolist()} skip every layer; a route needs at least one layer")
    return tuple(layer for layer, runs in enumerate(labels.tolist()) for _ in range(runs))


def decode_route(probs: Float[np.ndarray, "n_layers 3"]) -> LayerRoute:
    """The route of per-layer probabilities [SKIP, KEEP, REPEAT]: argmax per layer, ties to KEEP; if every
    layer decodes to SKIP, the layer with the highest KEEP probability is kept (first one on ties)."""
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2 or probs.shape[1] != N_ACTIONS or probs.shape[0] == 0:
        raise ValueError(f"probs have shape {probs.shape}; expected (n_layers, {N_ACTIONS}) with n_layers >= 1")
    labels = probs.argmax(-1)
    labels[probs[:, KEEP] >= probs.max(-1)] = KEEP
    if not labels.any():
        labels[int(probs[:, KEEP].argmax())] = KEEP
    return labels_to_route(labels)


def prompt_features(model: HookedTransformer, prompts: Sequence[Sequence[int] | Tensor],
                    layer: int | None = None, batch_size: int = 16) -> Float[Tensor, "n d_model"]:
    """Each prompt's representation under the unmodified model: the mean over its positions (BOS included, if
    the prompt has one) of the residual stream `blocks.{layer}.hook_resid_post`; float32 on CPU.

    `layer` defaults to (L-1)//2, the residual after the first half of the blocks: mid-depth residuals carry the
    prompt's content in a linearly readable form, while the last layers turn toward next-token prediction, and
    the router decides for every layer, early ones included. Prompts (token ids, 1-D) run in batches of similar
    length, right-padded under an attention mask and only up to `layer`; causal attention keeps the padding
    out of every real position, so a prompt's features do not depend on its batch.
    """
    n_layers = model.cfg.n_layers
    layer = (n_layers - 1) // 2 if layer is None else operator.index(layer)
    if not 0 <= layer < n_layers:
        raise ValueError(f"layer {layer} out of range for a {n_layers}-layer model (0..{n_layers - 1})")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}; expected >= 1")
    ids = [torch.as_tensor(p, dtype=torch.long, device=HOST) for p in prompts]
    bad = [i for i, t in enumerate(ids) if t.ndim != 1 or len(t) == 0]
    if bad:
        raise ValueError(f"prompt {bad[0]} has shape {tuple(ids[bad[0]].shape)}; expected 1-D token ids, non-empty")
    hook = f"blocks.{layer}.hook_resid_post"
    out = torch.empty(len(ids), model.cfg.d_model, device=HOST)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            lengths = [len(ids[i]) for i in rows]
            tokens = torch.zeros(len(rows), max(lengths), dtype=torch.long, device=HOST)
            for j, i in enumerate(rows):
                tokens[j, :lengths[j]] = ids[i]
            mask = (torch.arange(max(lengths), device=HOST) < torch.tensor(lengths, device=HOST)[:, None]).long()
            _, cache = model.run_with_cache(tokens.to(model.cfg.device), attention_mask=mask.to(model.cfg.device),
                                            names_filter=hook, stop_at_layer=layer + 1)
            resid = cache[hook].float().cpu()  # [batch, pos, d_model]
            for j, i in enumerate(rows):
                out[i] = resid[j, :lengths[j]].mean(0)
    return out


def _matrix(x, name: str) -> Float[Tensor, "n d"]:
    x = torch.as_tensor(x, device=HOST).float()
    if x.ndim != 2:
        raise ValueError(f"{name} have shape {tuple(x.shape)}; expected [n, d]")
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} contain non-finite values")
    return x


class LayerRouter:
    """Per-layer 3-way softmax heads (SKIP, KEEP, REPEAT) on a shared standardized input: a linear model
    (`hidden=0`, multinomial logistic regression per layer) or one ReLU hidden layer of width `hidden`.

    `fit` standardizes the features (mean and std of the training set; constant features keep scale 1) and
    minimizes the weighted mean over examples of the summed per-layer cross-entropy plus `weight_decay` times
    the squared weights (not biases), by full-batch L-BFGS for at most `steps` iterations. Output weights start
    at zero and output biases at the smoothed log class frequencies of each layer, so before any feature is
    used the router predicts each layer's majority label; hidden weights are drawn from a generator seeded
    with `seed`, so training is deterministic given the seed. Decoding: see `decode_route`.
    """

    def __init__(self, hidden: int = 0, weight_decay: float = 1e-2, steps: int = 100, seed: int = 0):
        if hidden < 0:
            raise ValueError(f"hidden={hidden}; expected 0 (linear) or a positive width")
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay={weight_decay}; expected >= 0")
        if steps < 1:
            raise ValueError(f"steps={steps}; expected >= 1")
        self.hidden, self.weight_decay, self.steps, self.seed = hidden, float(weight_decay), steps, seed
        self.params: list[Tensor] = []

    def _logits(self, x: Float[Tensor, "n d"]) -> Float[Tensor, "n n_layers 3"]:
        h = (x - self.mean) / self.scale
        if self.hidden:
            w1, b1, w2, b2 = self.params
            h = torch.relu(h @ w1 + b1)
        else:
            w2, b2 = self.params
        return (h @ w2 + b2).view(len(x), self.n_layers, N_ACTIONS)

    def fit(self, features: Float[Tensor, "N d"], labels: Int[np.ndarray, "N n_layers"],
            sample_weight: Float[np.ndarray, " N"] | None = None) -> LayerRouter:
        """Train on `features` [N, d] and per-layer `labels` [N, L] (SKIP/KEEP/REPEAT), examples weighted by
        `sample_weight` [N] (non-negative, not all zero; default equal)."""
        x = _matrix(features, "features")
        y = torch.as_tensor(np.asarray(labels), dtype=torch.int64, device=HOST)
        n, d = x.shape
        if n == 0:
            raise ValueError("features have 0 rows; fit needs at least one example")
        if y.ndim != 2 or y.shape[0] != n or y.shape[1] == 0:
            raise ValueError(f"labels have shape {tuple(y.shape)}; expected [{n}, n_layers] to match features "
                             f"of shape {tuple(x.shape)}")
        if ((y < SKIP) | (y > REPEAT)).any():
            raise ValueError(f"labels hold values {sorted(set(y.unique().tolist()))}; expected {SKIP}, {KEEP}, {REPEAT}")
        w = (torch.ones(n, device=HOST) if sample_weight is None
             else torch.as_tensor(np.asarray(sample_weight), device=HOST).float())
        if w.shape != (n,):
            raise ValueError(f"sample_weight has shape {tuple(w.shape)}; expected ({n},) to match features")
        if not (torch.isfinite(w).all() and (w >= 0).all() and w.sum() > 0):
            raise ValueError("sample_weight must be finite and non-negative with a positive sum")
        w = w / w.sum()
        self.n_layers, self.d = y.shape[1], d
        self.mean = x.mean(0)
        std = x.std(0, unbiased=False)
        self.scale = torch.where(std > 1e-6, std, torch.ones_like(std))

        freq = torch.stack([(w[:, None] * (y == c)).sum(0) for c in range(N_ACTIONS)], -1)  # [L, 3]
        b2 = torch.log((freq + 0.01) / (1 + 0.01 * N_ACTIONS)).reshape(-1)
        width = self.hidden or d
        w2 = torch.zeros(width, self.n_layers * N_ACTIONS, device=HOST)
        if self.hidden:
            g = torch.Generator().manual_seed(self.seed)
            w1 = torch.randn(d, self.hidden, generator=g, device=HOST) / d ** 0.5
            self.params = [w1, torch.zeros(self.hidden, device=HOST), w2, b2]
            weights = [w1, w2]
        else:
            self.params = [w2, b2]
            weights = [w2]
        for p in self.params:
            p.requires_grad_(True)

        opt = torch.optim.LBFGS(self.params, max_iter=self.steps, line_search_fn="strong_wolfe")

        def closure() -> Tensor:
            opt.zero_grad()
            ce = F.cross_entropy(self._logits(x).reshape(-1, N_ACTIONS), y.reshape(-1), reduction="none")
            loss = (w * ce.view(n, self.n_layers).sum(1)).sum()
            loss = loss + self.weight_decay * sum((p ** 2).sum() for p in weights)
            loss.backward()
            return loss

        opt.step(closure)
        for p in self.params:
            p.requires_grad_(False)
        return self

    def predict_proba(self, features: Float[Tensor, "n d"]) -> Float[Tensor, "n n_layers 3"]:
        """Per-layer probabilities of [SKIP, KEEP, REPEAT]."""
        if not self.params:
            raise RuntimeError("LayerRouter is not fitted; call fit first")
        x = _matrix(features, "features")
        if x.shape[1] != self.d:
            raise ValueError(f"features have shape {tuple(x.shape)}; the router was fitted on dimension {self.d}")
        with torch.no_grad():
            return torch.softmax(self._logits(x), -1)

    def predict_routes(self, features: Float[Tensor, "n d"]) -> list[LayerRoute]:
        """The decoded route of each row (`decode_route`)."""
        return [decode_route(p) for p in self.predict_proba(features).numpy()]


class Examples(NamedTuple):
    """Training examples: the question of each, its per-layer labels [N, L] (int64) and weight [N]."""

    question_ids: list[Hashable]
    labels: Int[np.ndarray, "N n_layers"]
    weights: Float[np.ndarray, " N"]


def training_examples(found: Mapping[Hashable, Sequence[tuple[Sequence[int], float]]], n_layers: int,
                      max_per_question: int = 4) -> Examples:
    """Labelled examples from the (route, reward) pairs a search evaluated on each training question.

    A route is an example when it was correct (reward >= 1) and has labels (`has_labels`; a search may reach
    routes that run a layer 3+ times, which are dropped). Per question the distinct such routes are taken in
    the order given (a search's evaluation order), the full path first when it is correct, up to
    `max_per_question`, each weighted 1/count so every contributing question weighs 1. Unlike Dr.LLM, which
    keeps only the default path when it is correct, the full path is one KEEP-everywhere example among the
    question's correct routes: the router sees both that this question needs no intervention and which
    interventions are also harmless. A question with no correct route contributes nothing.
    """
    if max_per_question < 1:
        raise ValueError(f"max_per_question={max_per_question}; expected >= 1")
    full = tuple(range(n_layers))
    qids, labels, weights = [], [], []
    for qid, pairs in found.items():
        correct = [validate_route(r, n_layers) for r, reward in pairs if float(reward) >= 1.0]
        routes = [r for r in dict.fromkeys(sorted(correct, key=lambda r: r != full)) if has_labels(r, n_layers)]
        routes = routes[:max_per_question]
        if not routes:
            continue
        qids += [qid] * len(routes)
        labels += [route_to_labels(r, n_layers) for r in routes]
        weights += [1.0 / len(routes)] * len(routes)
    return Examples(qids, np.array(labels, dtype=np.int64).reshape(-1, n_layers), np.array(weights, dtype=np.float64))


def _fold_of(question_ids: Sequence[Hashable], folds: int, seed: int) -> dict[Hashable, int]:
    """Balanced folds: questions ordered by a salted sha256 of (seed, id), then dealt round-robin."""
    def key(qid: Hashable) -> bytes:
        return hashlib.sha256(f"{seed}:{qid!r}".encode()).digest()
    return {qid: i % folds for i, qid in enumerate(sorted(question_ids, key=key))}


def cross_fit_routes(features: Mapping[Hashable, Float[Tensor, " d"]],
                     found: Mapping[Hashable, Sequence[tuple[Sequence[int], float]]], n_layers: int,
                     folds: int = 5, seed: int = 0, max_per_question: int = 4,
                     **router_kwargs) -> dict[Hashable, LayerRoute]:
    """The route a `LayerRouter(**router_kwargs)` predicts for each question of `features`, K-fold cross-fitted.

    Questions (keys of `features`) are split into `folds` balanced folds by a salted hash of their ids, a
    function of (ids, folds, seed) alone. For each fold a router is fitted on the `training_examples` of the
    other folds' `found` entries and predicts the fold's routes, so no question's route comes from a router
    that saw its own search results. Every question of `found` needs features; questions of `features` absent
    from `found` are predicted but train nothing. A fold whose training set has no example (no correct route
    in the other folds) predicts the full path for its questions.
    """
    if folds < 2:
        raise ValueError(f"folds={folds}; cross-fitting needs at least 2")
    missing = [q for q in found if q not in features]
    if missing:
        raise ValueError(f"questions {missing[:5]} of found have no features")
    x = {q: torch.as_tensor(f).float().to(HOST) for q, f in features.items()}
    bad = [q for q, f in x.items() if f.ndim != 1]
    if bad:
        raise ValueError(f"features of question {bad[0]!r} have shape {tuple(x[bad[0]].shape)}; expected [d]")
    fold = _fold_of(list(x), folds, seed)
    routes: dict[Hashable, LayerRoute] = {}
    for k in range(folds):
        held = [q for q in x if fold[q] == k]
        if not held:
            continue
        ex = training_examples({q: v for q, v in found.items() if fold[q] != k}, n_layers, max_per_question)
        if not ex.question_ids:
            routes.update({q: tuple(range(n_layers)) for q in held})
            continue
        router = LayerRouter(**router_kwargs).fit(torch.stack([x[q] for q in ex.question_ids]), ex.labels, ex.weights)
        routes.update(zip(held, router.predict_routes(torch.stack([x[q] for q in held]))))
    return {q: routes[q] for q in x}


def cross_fit_router(model: HookedTransformer, cells: Mapping[Hashable, tuple[Sequence[Tensor | Sequence[int]],
                                                                            Sequence[Hashable]]],
                     found: Mapping[tuple[Hashable, Hashable], Sequence[tuple[Sequence[int], float]]],
                     folds: int = 5, seed: int = 0, **router_kwargs) -> dict[tuple[Hashable, Hashable], LayerRoute]:
    """`cross_fit_routes` over questions pooled from several cells (e.g. the tasks of one model).

    `cells` maps a cell key to (prompt token ids, question ids) of its questions; `found` maps
    (cell key, question id) to the (route, reward) pairs searched on that question. Features are
    `prompt_features(model, prompts)` of each cell; folds = min(`folds`, number of questions).
    Returns the predicted route per (cell key, question id).
    """
    features: dict[tuple[Hashable, Hashable], Tensor] = {}
    for cell, (prompts, question_ids) in cells.items():
        if len(prompts) != len(question_ids):
            raise ValueError(f"cell {cell!r} has {len(prompts)} prompts for {len(question_ids)} question ids")
        features.update(zip(((cell, q) for q in question_ids), prompt_features(model, prompts)))
    return cross_fit_routes(features, found, model.cfg.n_layers, folds=max(2, min(folds, len(features))), seed=seed,
                            **router_kwargs)
