"""Layer routes: execution (skip masks, block loops over a path)."""
from reach_lens.hooks import is_skip_only, validate_route
from reach_lens.routing.execute import init_path_cache, run_path, skip_mask, skip_mask_hooks

__all__ = ["init_path_cache", "is_skip_only", "run_path", "skip_mask", "skip_mask_hooks", "validate_route"]
