"""Layer routes: action spaces, route searches under one budget, graded route candidates, a learned router.

Routes run through the generation engine (`reach_lens.generate`, `probes.route`); a skip-only route is also
an intervention (`interventions.Route`).
"""
from reach_lens.routing.evaluate import (METHODS, LearnedRouter, RouteEvaluator, RouterCell, known_candidates,
                                        make_search, random_route_candidates, router_routes, router_rows, search_rows)
from reach_lens.routing.local import Genetic, HillClimb, RandomSearch, random_method
from reach_lens.routing.mcts import MCTS
from reach_lens.routing.router import LayerRouter, cross_fit_router, cross_fit_routes, prompt_features
from reach_lens.routing.search import Search, SearchTrace, run_searches
from reach_lens.routing.spaces import ROUTE_LAWS, SPACES, ActionSpace, Segments, SkipOnly, SkipRepeat, make_space
from reach_lens.routes import LayerRoute

__all__ = ["ActionSpace", "LayerRoute", "SkipOnly", "SkipRepeat", "Segments", "SPACES", "ROUTE_LAWS", "make_space",
           "Search", "SearchTrace", "run_searches", "RandomSearch", "random_method", "MCTS", "HillClimb", "Genetic", "METHODS",
           "LayerRouter", "cross_fit_router", "cross_fit_routes", "prompt_features",
           "RouteEvaluator", "make_search", "search_rows", "random_route_candidates", "router_routes", "router_rows",
           "known_candidates", "LearnedRouter", "RouterCell"]
