"""Code snapshots, login side: the files that make a script's project (files.py), stored once by content
and hard-linked into one tree per distinct state of the project (store.py), under a size limit that says
what to leave out (limits.py), with where the code came from (provenance.py); collect.py removes what no
job needs any more.

A queued job, each of its requeues, every task of a sweep and a ``resubmit`` then run the code as it was
submitted, whatever happens to the work tree meanwhile. Nothing here is imported by the job side or at
the CLI's start: git and pathspec are touched only when a snapshot is made.
"""
