"""Logs (readers): what a run leaves behind read back, on the login node and in the job.

The driver's log into steps and failures, its command line, its checkpoints, diagnoses and
reports. The in-job runtime (hpcrl/runtime/) imports driver_log.py on nodes that may have only
the standard library: this file stays empty of imports, and driver_log.py stdlib-only.
"""
