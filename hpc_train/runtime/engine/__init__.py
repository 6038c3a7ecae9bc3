"""The backend engine: the job-side half of a backend (``backend.BackendRuntime`` and the defaults every
backend builds on) and the device meshes of a ``--parallel`` layout (``parallel``).

May import, when imported: ``launch/``, ``step/``, ``options``, and the layout's spec that the login side
checks too (``hpc_train.submission.layout``, pure). Never ``observe/`` or ``checkpoint/``: those are given
to a backend by the ``Context`` (tests/unit/test_structure.py holds every room to its rules)."""
