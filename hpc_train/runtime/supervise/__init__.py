"""The batch shell's tools, ``python -m hpc_train.runtime.supervise.X``: ``watchdog`` (hangs, with
``hang_report`` and ``outside_stacks``), ``between_runs`` (where a run began, what to do after it
failed), ``retries`` (the record of each retry decision), ``suspects`` (nodes named as a cause)
and ``node_check``. (What the ranks of a preflight job run, measuring the interconnect with torch, is
a rank's program: ``hpc_train.runtime.preflight_job``.)

May import, when imported: ``lifecycle/``, ``log``, ``hpc_train.fabric`` (the node check's probes) and
the standard library; never torch, the ``Context`` or the training library: a node whose CUDA is broken
must fail its check, not crash it (tests/unit/test_runtime_package.py proves it by the modules loaded)."""
