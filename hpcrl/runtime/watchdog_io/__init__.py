"""What the watchdog writes beside the driver: its log copy and its step-time records (stdlib only)."""
