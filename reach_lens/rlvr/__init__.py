"""The RLVR checkpoint study: train a base/RL/SFT lineage on a split disjoint from the audit, audit every
checkpoint under one protocol, and build the paper's Tables 5-8 and Figures 6-7 from the joined records.

    split       salted id-hash train/audit split and its fingerprints
    rewards     the verifiable reward: the task's grader on the completion (TRL reward function)
    data        GRPO and SFT training rows in the audit's prompt format
    recipes     frozen training recipes and where their checkpoints live
    train       TRL GRPOTrainer / SFTTrainer, resumable, saving a merged Hugging Face checkpoint
    audit_run   one checkpoint's resumable audit (greedy + 2K samples, native and shared formats)
    tables      Tables 5-8 and the fate / propensity tables from records
"""
from reach_lens.rlvr.recipes import Recipe, checkpoint_path, default_recipe
from reach_lens.rlvr.rewards import cut_at_stops, task_reward
from reach_lens.rlvr.split import Split, check_disjoint, ids_hash, split_questions

__all__ = ["Recipe", "Split", "check_disjoint", "checkpoint_path", "cut_at_stops", "default_recipe", "ids_hash",
           "split_questions", "task_reward"]
