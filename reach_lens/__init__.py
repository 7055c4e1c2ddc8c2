"""reach_lens: realized versus reachable, question by question, on TransformerLens HookedTransformers.

    from reach_lens import load_model, get_task, deploy, sample, Silence
    model = load_model()                                  # the embedded SmolLM2-135M-Instruct
    task = get_task("arc_easy")
    questions = task.load()[:8]
    greedy = deploy(model, task, questions, "native", interventions=[Silence(20, "mlp")])
"""

from reach_lens.version import __version__
from reach_lens.wheels import hide_broken_wheels

hide_broken_wheels()  # before transformers is imported: see reach_lens.wheels

from reach_lens.audit import reach_curve, summarize
from reach_lens.generate import Engine, Generation, Request, engine_for
from reach_lens.interventions import Latents, Route, Silence, Steer, Units, hooks_for, intervention_from_dict
from reach_lens.models import encode, load_model, model_fingerprint, prune_magnitude
from reach_lens.probes import deploy, recognize, route, sample
from reach_lens.protocol import Protocol
from reach_lens.store import RunStore
from reach_lens.tasks import TASK_NAMES, get_task, subsample

__all__ = ["Engine", "Generation", "Latents", "Protocol", "Request", "Route", "RunStore", "Silence", "Steer", "TASK_NAMES",
           "Units", "deploy", "encode", "engine_for", "get_task", "hooks_for", "intervention_from_dict",
           "load_model", "model_fingerprint", "prune_magnitude", "reach_curve", "recognize", "route", "sample",
           "subsample", "summarize"]
