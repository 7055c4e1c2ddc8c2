"""Layer routes: action spaces, route searches under one budget, graded route candidates, a learned router.

Routes run through the generation engine (`reach_lens.generate`, `probes.route`); a skip-only route is also
an intervention (`hooks.Route`).
"""
from reach_lens.routing.evaluate import RouteEvaluator, RouterCell, learned_router_outcomes
from reach_lens.routing.local import Genetic, HillClimb, RandomSearch
from reach_lens.routing.mcts import MCTS
from reach_lens.routing.router import LayerRouter, cross_fit_router, cross_fit_routes, prompt_features
from reach_lens.routing.search import Search, SearchTrace, run_searches
from reach_lens.routing.spaces import SPACES, ActionSpace, Path, Segments, SkipOnly, SkipRepeat, make_space

METHODS: dict[str, type[Search]] = {cls.name: cls for cls in (RandomSearch, MCTS, HillClimb, Genetic)}

__all__ = ["ActionSpace", "Path", "SkipOnly", "SkipRepeat", "Segments", "SPACES", "make_space",
           "Search", "SearchTrace", "run_searches", "RandomSearch", "MCTS", "HillClimb", "Genetic", "METHODS",
           "LayerRouter", "cross_fit_router", "cross_fit_routes", "prompt_features",
           "RouteEvaluator", "RouterCell", "learned_router_outcomes"]
