"""hpc_train's built-in plugins. Each module registers through the ``hpc_train`` entry-point group,
exactly as a third-party plugin does; the core never imports this package."""
