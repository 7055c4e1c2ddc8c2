"""reach_lens: realized versus reachable, question by question, on TransformerLens HookedTransformers."""

from reach_lens.models import encode, load_model, prune_magnitude

__all__ = ["encode", "load_model", "prune_magnitude"]
