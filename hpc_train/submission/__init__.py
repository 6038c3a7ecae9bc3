"""From a job spec to a submitted script: plan, layout checks, rendering, shell quoting, the executor, Slurm commands."""
