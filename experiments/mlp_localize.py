"""MLP localization of recognizes-but-does-not-say failures (the paper's Tables 3-4, Figures 4b and 5).

    python experiments/mlp_localize.py                                     # embedded SmolLM2-135M, ARC-Easy
    python experiments/mlp_localize.py --task piqa --planted 25 --n 400 --min-panel 4   # easy control: a bias push
    python experiments/mlp_localize.py --task piqa --planted-units 12 --n 400             # selective control
    python experiments/mlp_localize.py --units sae --sae saes/l20-mlp_out                # top-k SAE latents
    python experiments/mlp_localize.py --model path/to/ckpt --task arc_challenge --source data/arc/
    python experiments/mlp_localize.py --prune 0.3 --prune-created --n 1000   # failures that pruning creates

Recipe (each condition's per-question answers are stored as computed; a rerun computes nothing twice):
 1. screen n questions (``--n all``: every one): recognition (gold option ranked first by likelihood) and greedy
    generation; fix the failure set (recognized, not generated; the unparseable greedy answers counted, or left out
    with ``--exclude-format-failures``) and the healthy panel (generated; ``--healthy-rule``), split each by a
    hash of the id into calibration and evaluation questions; stop early when a panel is too small;
 2. selection sweep on the CALIBRATION questions: silence the MLP and the attention of every layer; the
    identified MLP is the best by ``--layer-rule`` (net: repair - breakage; repair: the paper's), the runner-ups
    the best other components by the same rule;
 3. on the EVALUATION questions only: the identified MLP, attention and whole layer there and the runner-ups;
    paired margins (Newcombe) of its repair over each runner-up, and the verdict;
 4. steering along v (calibration failure-minus-healthy mean MLP output at the last prompt token): -alpha v
    rescues, +alpha v induces, added to the MLP output at every position (prompt and generated tokens); each
    direction's dose chosen on calibration, every alpha reported on evaluation beside a random direction of |v|;
 5. the top-k units along v (``--unit-rank``: by mean contribution on the calibration failures, activation x
    W_out[u] . v/|v|, default; or by W_out[u] . v/|v| alone) against random-k sets, relative to the whole block's
    repair (``--units sae --sae PATH``: the latents of a SAELens SAE at an MLP output instead of the MLP's units).

Cost: the selection sweep (2 components x 30 layers on <= 32 + 32 calibration questions) is most of the run; the
whole layer is silenced only at the identified layer (the paper's component control), not swept; conditions
decode 64 rows at a time (``--batch-size``). Its time on a 2-core CPU is in docs/results.md.
"""

from __future__ import annotations

import argparse
import resource
import time

from reach_lens import cli, localize, logs
from reach_lens.errors import UserError
from reach_lens.generate import engine_for
from reach_lens.models import model_fingerprint, prune_magnitude
from reach_lens.protocol import Protocol
from reach_lens.report import write_report
from reach_lens.store import RunStore

say = logs.say("mlp_localize")


def parse_args(argv=None) -> argparse.Namespace:
    data = cli.data(n=300, chunk=64, task="arc_easy", n_all=True)  # --n: questions screened, or all of them
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                parents=[cli.common(out="runs/mlp_localize", batch_size=64), data])
    p.add_argument("--recognition", default="sum", choices=localize.RECOGNITION_RULES,
                   help="recognition: the gold option ranked first by summed (sum, default) or per-token (norm) "
                        "option log-likelihood")
    p.add_argument("--healthy-rule", default="already-correct", choices=localize.HEALTHY_RULES,
                   help="healthy panel: generated correctly (the paper's, default) or also recognized")
    p.add_argument("--exclude-format-failures", action="store_true",
                   help="leave greedy answers no letter was read from out of the failure set (default: counted in, "
                        "and their number reported)")
    p.add_argument("--layers", type=localize.parse_layers, default=None, help="layers swept, e.g. '0-29' or '10,12'")
    p.add_argument("--layer-rule", default="net", choices=localize.LAYER_RULES,
                   help="identified MLP: largest repair - breakage (net, default) or largest repair (the paper's)")
    p.add_argument("--max-eval", type=cli.positive_int, default=40, help="evaluation questions per panel (40)")
    p.add_argument("--max-calibration", type=cli.positive_int, default=32, help="calibration questions per panel (32)")
    p.add_argument("--calibration-share", type=cli.share, default=0.5,
                   help="share of each panel's questions (by id hash) used for calibration (default 0.5)")
    p.add_argument("--min-panel", type=cli.positive_int, default=5, help="fewest questions per panel and split")
    p.add_argument("--runner-ups", type=cli.positive_int, default=3, help="best other components evaluated")
    p.add_argument("--alphas", type=cli.positive_float, nargs="+", default=[2.0, 4.0, 8.0],
                   help="steering doses: multiples of v added (-) or (+) (default 2 4 8)")
    p.add_argument("--unit-k", type=cli.positive_int, default=32, help="units in the top-k and each random set (32)")
    p.add_argument("--unit-rank", default="contribution", choices=localize.UNIT_RANKS,
                   help="top units by their mean contribution along v on the calibration failures (activation x "
                        "W_out[u] . v/|v|; default) or by their output weights alone (W_out[u] . v/|v|)")
    p.add_argument("--random-seeds", type=cli.positive_int, default=5, help="random-unit control sets")
    p.add_argument("--units", default="mlp", choices=("mlp", "sae"),
                   help="top-k step over MLP units (default) or over the latents of an SAE at an MLP output (--sae)")
    p.add_argument("--sae", type=cli.existing_path, default=None, metavar="PATH",
                   help="SAELens directory of an SAE at blocks.L.hook_mlp_out (with --units sae; needs the [sae] extra)")
    p.add_argument("--prune", type=cli.share, default=None, help="study a magnitude-pruned copy (MLP sparsity)")
    p.add_argument("--prune-created", action="store_true",
                   help="with --prune, the source study's construction: screen the pruned copy only on the questions "
                        "the unpruned model recognizes and generates, so every failure is one pruning created")
    plant = p.add_mutually_exclusive_group()
    plant.add_argument("--planted", type=cli.nonnegative_int, default=None, metavar="LAYER",
                       help="easy positive control: an output-bias push towards one letter in the MLP of LAYER")
    plant.add_argument("--planted-units", type=cli.nonnegative_int, default=None, metavar="LAYER",
                       help="selective control: a rank-1 W_out edit of LAYER on units that fire on part of the pool")
    p.add_argument("--planted-k", type=cli.positive_int, default=8, help="units of the unit plant")
    p.add_argument("--planted-share", type=cli.share, default=0.3, help="share of the pool the plant's units fire on")
    p.add_argument("--planted-strength", type=cli.positive_float, default=None,
                   help="strength of the plant (default: the smallest power of 2 that fails >= half of the measured)")
    args = p.parse_args(argv)
    if (args.units == "sae") != (args.sae is not None):
        p.error("--units sae and --sae PATH go together (the latents of the SAE at PATH replace MLP units)")
    if args.prune_created and not args.prune:
        p.error("--prune-created needs --prune SPARSITY (the failures a pruned copy makes on what the model answers)")
    if args.prune_created and (args.planted is not None or args.planted_units is not None):
        p.error("--prune-created and --planted/--planted-units are two constructions of one failure set; choose one")
    return args


def load_unit_sae(path, model):
    """The SAE of ``--sae``, checked before any work: it must read an MLP output of this model."""
    try:
        from reach_lens.sae import load_mlp_sae

        return load_mlp_sae(path, model)
    except (ImportError, ValueError) as e:
        raise UserError(str(e)) from None


def main(argv=None) -> int:
    args = parse_args(argv)
    loop, started = cli.setup(args), time.time()
    (task,) = cli.tasks(args).values()
    if task.kind != "mc":
        raise UserError(f"--task {args.task}: {task.name!r} is not multiple choice: the failure criterion needs "
                        "recognition (option likelihoods)")
    questions = cli.questions(task, args.source, args.split, args.n, args.seed, args.skip)
    say(f"loading model {args.model or 'smollm2-135m-instruct (embedded)'}")
    model = cli.load(args)
    args.fmt = task.resolve_format(args.fmt, engine_for(model).tokenizer)  # auto: chat template, or plain text
    if args.prune and not args.prune_created:  # pruning-created failures: the unpruned model screens first
        model = prune_magnitude(model, args.prune)
    sae = load_unit_sae(args.sae, model) if args.sae else None
    plant, plant_layer = ("bias", args.planted) if args.planted is not None else ("units", args.planted_units)
    try:
        layers = localize.check_layers(args.layers or list(range(model.cfg.n_layers)), model.cfg.n_layers)
        localize.check_layers([] if plant_layer is None else [plant_layer], model.cfg.n_layers)
    except ValueError as e:
        raise UserError(str(e)) from None
    settings = {k: getattr(args, k) for k in ("recognition", "healthy_rule", "exclude_format_failures", "max_eval",
                                              "max_calibration", "calibration_share", "alphas", "unit_k",
                                              "unit_rank", "random_seeds", "prune", "planted", "planted_units",
                                              "planted_k", "planted_share", "planted_strength", "units")}
    if args.prune_created:  # only when set, so that every other run keeps its protocol
        settings["prune_created"] = True
    if sae is not None:  # which SAE's latents the units step silences: another SAE is another run
        from reach_lens.sae import describe_sae
        settings["sae"] = describe_sae(sae)
    protocol = Protocol.of(study="mlp_localize", facts=engine_for(model).describe(), task=task, questions=questions,
                           source=args.source, split=args.split, seed=args.seed, fmt=args.fmt, probe="screen",
                           settings={**settings, "layers": layers})
    tag = f"{model.cfg.model_name}-{task.name}-n{len(questions)}{cli.skip_tag(args)}-s{args.seed}"
    tag += "" if plant_layer is None else f"-planted{'-units' if plant == 'units' else ''}{plant_layer}"
    tag += "" if sae is None else f"-sae{settings['sae']['weights'][:8]}"
    tag += "" if not args.prune else f"-prune{args.prune:g}" + ("-created" if args.prune_created else "")
    run_dir = args.out / tag
    store = RunStore(run_dir, protocol)
    say(f"run directory {run_dir} (resumes if interrupted)")

    def screen(model, store, table: str, recognize: str = "all"):  # rows in question order
        return loop.resume(store, table, questions, lambda part: localize.screen(
            model, task, part, args.fmt, args.recognition, batch_size=args.batch_size, recognize=recognize),
            desc=table)

    planted = None
    if plant_layer is not None:  # the positive control: study a planted copy on the pool it is defined on
        base = screen(model, store, "screen_base", recognize="generated")  # the pool needs both
        try:
            pool, base_correct = localize.control_pool(model, task, questions, base, args.fmt, plant_layer, store,
                                                       args.batch_size)
            model, planted = localize.plant_control(plant, model, task, pool, args.fmt, plant_layer, store,
                                                    units_k=args.planted_k, share=args.planted_share,
                                                    strength=args.planted_strength, batch_size=args.batch_size)
        except ValueError as e:
            raise UserError(str(e)) from None
        planted["base_correct"], questions = base_correct, pool
        store = RunStore(run_dir / "planted_model", protocol.replace(
            weights=model_fingerprint(model), settings={**protocol.settings, "planted_strength": planted["strength"]}))

    pruned = None
    if args.prune_created:  # the source study's pruned case: failures pruning creates among what the model answers
        base = screen(model, store, "screen_unpruned", recognize="generated")
        pool = localize.answered(questions, base)
        model = prune_magnitude(model, args.prune)
        pruned = {"sparsity": args.prune, "screened": len(questions), "pool": len(pool)}
        say(f"pool: {len(pool)} of {len(questions)} questions the unpruned model recognizes and generates; "
            f"screening the {args.prune:.0%}-MLP-pruned copy on them")
        questions = pool
        store = RunStore(run_dir / "pruned_model", protocol.replace(weights=model_fingerprint(model)))

    # 1. screen and panels, fixed before any intervention
    screened = screen(model, store, "screen")
    panels = store.read("panels")
    if not len(panels):
        panels = localize.build_panels(screened, args.seed, args.calibration_share, args.max_eval,
                                       args.max_calibration, args.healthy_rule, args.exclude_format_failures)
        store.append("panels", panels)
    masks = localize.panel_masks(screened, args.healthy_rule, args.exclude_format_failures)
    eligible = {k: int(m.sum()) for k, m in masks.items()}
    say(f"screened {len(screened)}: recognition {screened.recognized.mean():.1%}, generation "
        f"{screened.generated.mean():.1%}; eligible {eligible}; panels {localize.panel_sizes(panels)}")
    try:
        localize.check_panels(panels, args.min_panel, eligible)
    except localize.PanelTooSmall as e:
        raise UserError(str(e)) from None
    conditions = localize.Conditions(model, task, args.fmt, store, panels, questions, args.batch_size)

    # 2. selection on calibration questions; 3. evaluation of the choice
    sweep = localize.selection_sweep(conditions, layers)
    layer = localize.identify_layer(sweep, args.layer_rule)
    say(f"identified MLP {layer} on calibration (rule '{args.layer_rule}')")
    evaluation, margins, verdict = localize.evaluate_choice(conditions, sweep, layer, args.layer_rule, args.runner_ups)

    # 4. steering along v; 5. units along v
    v, v_info = localize.mlp_direction(model, layer, localize.calibration_prompts(conditions, "failure"),
                                       localize.calibration_prompts(conditions, "healthy"), args.batch_size)
    steering, doses = localize.steering(conditions, layer, v, args.alphas)
    if sae is None:
        units = localize.unit_arms(conditions, layer, v, args.unit_k, args.random_seeds, rank=args.unit_rank)
        units_layer = None
    else:  # the SAE's own MLP, attached with its error term: the model's answers do not change
        from reach_lens.sae import attach
        units_layer = int(sae.cfg.metadata.hook_name.split(".")[1])
        sae_model = attach(model, sae, use_error_term=True)
        latent_conditions = localize.Conditions(sae_model, task, args.fmt, store, panels, questions, args.batch_size)
        sae_v = v if units_layer == layer else localize.mlp_direction(
            model, units_layer, localize.calibration_prompts(conditions, "failure"),
            localize.calibration_prompts(conditions, "healthy"), args.batch_size)[0]
        units = localize.unit_arms(latent_conditions, units_layer, sae_v, args.unit_k, args.random_seeds, sae=sae,
                                   rank=args.unit_rank)

    study = localize.Study(tag=tag, settings={**vars(args), "layers": layers}, screened=screened, panels=panels,
                           eligible=eligible, sweep=sweep, layer=layer, evaluation=evaluation, margins=margins,
                           verdict=verdict, baseline=localize.baseline_check(conditions), v_info=v_info,
                           steering=steering, doses=doses, units=units, planted=planted, pruned=pruned,
                           conditions=store.read("conditions", key="row_key"),
                           units_layer=None if units_layer == layer else units_layer,
                           elapsed_s=time.time() - started,
                           peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(localize.write_outputs(study, run_dir, args.figures), flush=True)
    say(f"tables, figures and summary.md in {run_dir}; figures copied to {args.figures}")
    say(f"report: {write_report(run_dir)}")
    return 0


if __name__ == "__main__":
    cli.run(main)
