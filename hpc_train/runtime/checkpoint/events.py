"""What a checkpointer announces, for whoever follows it: the metrics number a restored run's steps from
its checkpoint, the profiler puts a range around each save, and whatever comes next subscribes the same
way (``Checkpointer.subscribe``) instead of replacing the checkpointer's methods, which a reader of the
checkpointer could not see and a change to it could break.

Every event reaches every rank's observers, in the order they subscribed, from the thread that called the
checkpointer (never from an async writer). An observer's error is the run's: nothing is swallowed.
Imports nothing: the observers import it, the checkpointer imports it, neither imports the other.
"""

from __future__ import annotations


class CheckpointObserver:
    """Follows a checkpointer; each event does nothing unless a subclass says otherwise."""

    def before_save(self, step: int) -> None:
        """A save of ``step`` begins (every rank calls ``save``)."""

    def after_save(self, step: int) -> None:
        """``save(step)`` returns or raises: its blocking part is over (an async save may still be writing)."""

    def after_commit(self, step: int) -> None:
        """Every rank's share of ``step`` is durable and the checkpoint is committed."""

    def after_restore(self, step: int) -> None:
        """``restore()`` chose ``step`` to continue from (0: the run starts afresh)."""
