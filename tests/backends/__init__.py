"""Tests that need the backends' frameworks built and installed (make backends): Horovod, DeepSpeed, mpi4py, mpirun."""
