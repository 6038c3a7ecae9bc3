"""A rank's life between the scheduler and the script: when to stop (``preemption``: a signal, the stop
file, the clock), the heartbeat a watchdog outside reads (``heartbeat``), and the do-not-requeue file
(``no_retry``).

May import nothing else of the runtime: standard library and ``hpc_train.contract``, so the batch
shell's tools and the interpreter boot read them without the training library."""
