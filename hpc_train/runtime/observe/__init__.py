"""What a run shows of itself: ``metrics`` (the recorder: each step's numbers into steps.jsonl) with its
views ``tensorboard_sink`` and ``prometheus_sink``, its ``clocks``, ``step_values`` and ``gpu_sampler``;
``straggler`` (the slow rank and its host) and ``profiling`` (torch traces, nsys ranges). Observers follow
the checkpointer through ``checkpoint.events`` and change nothing in training.

May import, when imported: ``checkpoint/`` (its events), ``step/``, ``log`` and the profile's spec
(``hpc_train.config.profile_spec``, parsed on the login side too)."""
