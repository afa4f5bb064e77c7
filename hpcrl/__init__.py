"""hpcrl: plan, render, submit and watch multi-node RL post-training jobs on Slurm."""

__version__ = "0.1.0"
