"""One generation engine for every probe: per-row prompts, routes, interventions, greedy or seeded sampling.

    from reach_lens.generate import Request, engine_for
    gens = engine_for(model).generate([Request(prompt_ids, max_new_tokens=8, temperature=0.8, seed=3)])

Modules: ``types`` (Request, LoglikRequest, Generation), ``engine`` (the Engine interface and its
TransformerLens implementation), ``loop`` (the batched decode loop and route schedules), ``prefill``
(prompt prefill with shared clean prefixes and route tries), ``attention`` (KV buffers and the fast cached
attention), ``choice`` (token choice, seeds, stop checks).
"""

from reach_lens.generate.choice import NonFiniteLogits, row_seed
from reach_lens.generate.engine import Engine, TransformerLensEngine, engine_for, first_hooked_layer
from reach_lens.generate.types import EngineCapabilityError, Generation, LoglikRequest, Request

__all__ = ["Engine", "EngineCapabilityError", "Generation", "LoglikRequest", "NonFiniteLogits", "Request",
           "TransformerLensEngine", "engine_for", "first_hooked_layer", "row_seed"]
