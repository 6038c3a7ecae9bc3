"""Sweeps: a grid of variants as job arrays (submit) and their handle (status, wait, resubmit)."""
