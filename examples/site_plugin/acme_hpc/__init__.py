"""hpc_train site plugin for the ACME cluster (an example; see docs/site-plugin-guide.md)."""

__version__ = "0.1.0"
