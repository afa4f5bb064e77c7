"""Training-framework backends: what the driver command looks like and which flags exist."""
