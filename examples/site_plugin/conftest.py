# hpc_train's fixtures for plugin authors: hpc_train_plugins, hpc_train_render, hpc_train_policy, hpc_train_golden.
pytest_plugins = ["hpc_train.testing"]
