"""The plugin contract: hook specs, the backend base class, the plugin manager, entry points."""
