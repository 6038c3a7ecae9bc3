"""Requeue-aware checkpoints. ``manager`` is the Checkpointer a script gets from ``ctx.checkpointer()``, its
save side; ``restore`` its restore side (which checkpoint a run continues from, loaded on every rank or on
none), ``failures`` the errors either side raises in words a user can act on, and ``stop`` what a run that
must stop does once it is saved (requeue, or the code that says resubmit). Around them: ``files`` (digests, fsync, who writes what), ``commit`` (a folder made complete, COMMIT last),
``shares`` (replicated state written by every rank, each its share, in the foreground or a thread),
``sharded`` (tensor-parallel and pipeline state through torch.distributed.checkpoint), ``reshape``
(another job's checkpoint at another world size), ``rng`` (every rank's generators), ``events`` (what
observers follow: save, commit, restore) and ``local/`` (the node-local tier).

May import, when imported: ``lifecycle/``, ``supervise/`` (the retry record a refused restore leaves),
``log`` and the shape a checkpoint declares (``hpc_train.resume_shape``, read on the login side too)."""
