"""One function per figure kind: each takes a DataFrame, returns the matplotlib ``Figure``, and writes it as a PNG
(150 dpi) when given a ``path`` (``save(fig, path)`` writes any of them later).

The tables are those audit produces: `audit.reach_curve`, rows of `audit.summarize`, and `stats.Rate.to_dict`
rows (X, X_lo, X_hi, X_n); and for the routing and selection studies those of `reach_lens.routing.analysis`. Figures
are drawn on a bare `Figure` (no pyplot, no global backend change).

Modules, one per study: ``common`` (``save``, the legend, limit and label helpers, ``GUESSER``), ``sampling``
(reach@k curve, deployed / vote / oracle and selection gap vs temperature, the Table 2 gap figure, O_k - D
over k per cell), ``selection``
(answer-blind recovery, selection gap per cell), ``routing`` (oracle curves over routes, random minus structured
search, the ``SERIES_*`` tables), ``localize`` (silencing sweep, steering, units vs block), ``census`` (recognition
vs generation), ``rlvr`` (fates, changes, propensity, lineage, training curve, reach curves of the checkpoints).
"""

from reach_lens.plots.census import plot_census
from reach_lens.plots.common import DPI, GUESSER, data_top, legend_outside, place_labels, save
from reach_lens.plots.localize import (ARM_COLORS, COMPONENT_COLORS, plot_layer_sweep, plot_steering,
                                       plot_units_vs_block)
from reach_lens.plots.rlvr import (CHECKPOINT_COLORS, plot_rlvr_changes, plot_rlvr_fates, plot_rlvr_lineage,
                                   plot_rlvr_propensity, plot_rlvr_reach_curves, plot_rlvr_training)
from reach_lens.plots.routing import (LABELLED_CELLS, SERIES_COLORS, SERIES_LABELS, SERIES_MARKERS, plot_oracle_curves,
                                      plot_random_minus_structured)
from reach_lens.plots.sampling import plot_gap_curves, plot_gap_table, plot_reach_curve, plot_temperature_gap
from reach_lens.plots.selection import plot_recovery, plot_selection_gap

__all__ = ["ARM_COLORS", "CHECKPOINT_COLORS", "COMPONENT_COLORS", "DPI", "GUESSER", "LABELLED_CELLS", "SERIES_COLORS",
           "SERIES_LABELS", "SERIES_MARKERS", "data_top", "legend_outside", "place_labels", "plot_census",
           "plot_gap_curves", "plot_gap_table", "plot_layer_sweep", "plot_oracle_curves",
           "plot_random_minus_structured", "plot_reach_curve", "plot_recovery", "plot_rlvr_changes", "plot_rlvr_fates",
           "plot_rlvr_lineage", "plot_rlvr_propensity", "plot_rlvr_reach_curves", "plot_rlvr_training",
           "plot_selection_gap", "plot_steering", "plot_temperature_gap", "plot_units_vs_block", "save"]
