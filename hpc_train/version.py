"""hpc_train's version, in a module of its own: the caches' keys and the rendered script's header read it
without importing the package's ``__init__`` (which would close a circle through every module it names)."""

__version__ = "0.1.0"
