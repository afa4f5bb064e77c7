"""The best layout's step estimate of one config at several node counts (docs/api.md)."""

import hpcrl.api as h

for nodes in (4, 8, 16):
    best = h.plan(config="verl-grpo-qwen2.5-7b", nodes=nodes).layouts[0]
    print(nodes, best.step_time_s)
