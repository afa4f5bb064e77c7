"""Processes that run inside the job: the watchdog around the driver and the GPU monitor."""
