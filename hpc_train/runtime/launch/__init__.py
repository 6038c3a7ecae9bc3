"""How a process becomes a rank: who am I (``environment``, from whichever launcher started it), the
arguments a launcher put before the script's own (``argv``), the one-task-one-rank shim that srun and
mpirun start (``python -m hpc_train.runtime.launch.worker``) and the signal guard torchrun runs under
(``signal_guard``).

May import nothing else of the runtime: standard library and ``hpc_train.contract``."""
