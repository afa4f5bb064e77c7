"""Memory planner: learner (DeepSpeed ZeRO), engine (vLLM) and host RAM, pure arithmetic."""
