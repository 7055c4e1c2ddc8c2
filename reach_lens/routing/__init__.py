"""Layer routes: execution (skip masks, block loops over a path), action spaces, route search, batched
generation under routes, graded route candidates, and a learned router."""
from reach_lens.hooks import is_skip_only, validate_route
from reach_lens.routing.decode import RouteGeneration, RouteGenerator, schedule
from reach_lens.routing.evaluate import RouteEvaluator, RouterCell, graded, learned_router_outcomes
from reach_lens.routing.execute import init_path_cache, run_path, skip_mask, skip_mask_hooks
from reach_lens.routing.local import Genetic, HillClimb, RandomSearch, crossover
from reach_lens.routing.mcts import MCTS
from reach_lens.routing.router import LayerRouter, cross_fit_router, cross_fit_routes, prompt_features
from reach_lens.routing.search import Search, SearchTrace, run_searches
from reach_lens.routing.spaces import SPACES, ActionSpace, Path, Segments, SkipOnly, SkipRepeat, make_space

METHODS: dict[str, type[Search]] = {cls.name: cls for cls in (RandomSearch, MCTS, HillClimb, Genetic)}

__all__ = ["init_path_cache", "is_skip_only", "run_path", "skip_mask", "skip_mask_hooks", "validate_route",
           "ActionSpace", "Path", "SkipOnly", "SkipRepeat", "Segments", "SPACES", "make_space",
           "Search", "SearchTrace", "run_searches", "RandomSearch", "MCTS", "HillClimb", "Genetic", "crossover",
           "METHODS", "LayerRouter", "cross_fit_router", "cross_fit_routes", "prompt_features",
           "RouteGeneration", "RouteGenerator", "schedule", "RouteEvaluator", "RouterCell", "graded",
           "learned_router_outcomes"]
