"""Jobs (side effects): Slurm, the run registry, the run directory, submit and preflight.

Every Slurm command goes through one function in slurm.py. Kept empty of imports so a command
loads only the modules it uses.
"""
