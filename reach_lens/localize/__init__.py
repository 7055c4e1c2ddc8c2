"""The MLP-localization study (the paper's Tables 3-4, Figures 4b and 5), as library parts.

Vocabulary (docs/concepts.md): a question is *recognized* when multiple-choice likelihood ranks its gold option first
and *generated* when greedy direct generation answers it correctly; the **failure set** is recognized but not
generated, the **healthy panel** generated correctly (by default). Calibration questions choose; evaluation
questions measure.

Modules: ``panels`` (screen, panels and their checks), ``activations`` (last-token activations, logits, the
direction v), ``conditions`` (stored greedy answers under interventions), ``steps`` (selection sweep,
evaluation of the choice, steering), ``units`` (the top-k units along v against random sets), ``verdict``
(layer rules, runner-ups, paired margins, verdict), ``plants`` and ``controls`` (planted failures for the
positive controls), ``report`` (tables, figures, summary).
"""

from reach_lens.localize.activations import (last_prompt_activations, last_prompt_logits, mlp_direction,
                                             perturbed_last_activations)
from reach_lens.localize.conditions import Conditions, panel_rates
from reach_lens.localize.controls import PLANTS, answered, control_pool, plant_control
from reach_lens.localize.panels import (HEALTHY_RULES, RECOGNITION_RULES, PanelTooSmall, build_panels, check_panels,
                                        format_failures, panel_masks, panel_sizes, screen, split_value)
from reach_lens.localize.plants import UnitPlant, answer_push, plant_answer_failure, plant_unit_failure, trigger_units
from reach_lens.localize.report import Study, summary, write_outputs
from reach_lens.localize.steps import (COMPONENT_SITES, SWEPT, baseline_check, calibration_prompts, check_layers,
                                       evaluate_choice, parse_layers, selection_sweep, silence_component, silence_name,
                                       steering)
from reach_lens.localize.units import UNIT_RANKS, top_units, unit_arms, unit_scores
from reach_lens.localize.verdict import (LAYER_RULES, identify_layer, margins, runner_ups,
                                         verdict)

__all__ = ["COMPONENT_SITES", "Conditions", "HEALTHY_RULES", "LAYER_RULES", "PLANTS", "PanelTooSmall",
           "RECOGNITION_RULES", "SWEPT", "Study", "UNIT_RANKS", "UnitPlant", "answer_push", "baseline_check",
           "answered", "build_panels", "calibration_prompts", "check_layers", "check_panels", "control_pool", "evaluate_choice",
           "format_failures", "identify_layer", "last_prompt_activations", "last_prompt_logits", "margins",
           "mlp_direction", "panel_masks", "panel_rates", "panel_sizes", "parse_layers",
           "perturbed_last_activations", "plant_answer_failure", "plant_control", "plant_unit_failure", "runner_ups",
           "screen", "selection_sweep", "silence_component", "silence_name", "split_value", "steering", "summary",
           "top_units", "trigger_units", "unit_arms", "unit_scores", "verdict", "write_outputs"]
