"""Code snapshots, login side: the files that make a script's project (files.py), stored once by content
and hard-linked into one tree per distinct state of the project (store.py), under a size limit that says
what to leave out (limits.py), with where the code came from (provenance.py). take.py takes one for a
submit (and undoes it when the scheduler refuses the job); code.py is the record the plan, the job's and
a sweep's records carry; needed.py says which trees a queued job still runs and collect.py removes the
rest; compare.py names the files that changed since a checkpoint was saved.

A queued job, each of its requeues, every task of a sweep and a ``resubmit`` then run the code as it was
submitted, whatever happens to the work tree meanwhile. Nothing here is imported by the job side or at
the CLI's start: git and pathspec are touched only when a snapshot is made.
"""
