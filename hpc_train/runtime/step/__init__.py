"""One optimizer step done right: micro-batches that fit in memory (``memory``: ``--micro-batch``, an
out-of-memory step redone with half) and bad numerics skipped on every rank (``numerics``).

May import, when imported: ``lifecycle/`` (the do-not-requeue file) and ``log``. Never a backend."""
