"""The fabric: NCCL/InfiniBand profiles, doctor (node checks), preflight (bandwidth tests)."""
