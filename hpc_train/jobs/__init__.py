"""Submitted jobs: records and handles, job states, the one poller, logs, live progress, reports."""
