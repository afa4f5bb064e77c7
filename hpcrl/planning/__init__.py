"""Planning (pure): from a run config and a cluster profile to a checked plan.

Numbers in, numbers out: layouts, disk budgets, checkpoint cadence, wall times, and the run
config itself. Nothing here starts a process or talks to Slurm (tests/test_architecture.py).
The framework backends (backends/) live here because the planner asks them for the workload,
the pins and the layouts; the driver command they return is words that rendering quotes.
Kept empty of imports so a command loads only the modules it uses.
"""
