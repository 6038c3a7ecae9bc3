"""Submitting from a laptop: the same ``submit``, ``status``, ``logs``, ``cancel`` and ``report``, run on a
cluster's login node through the system's OpenSSH (the user's ``~/.ssh/config``, ProxyJump, agent and keys),
one ControlMaster connection shared by the calls. settings.py says where (``--remote HOST`` and the user's
``remote:`` config), ssh.py runs and explains ssh, upload.py sends the script's project with rsync (only
what changed), client.py is the laptop's side of each command and serve.py the login node's side of a
submit, which a key makes safe to retry: a submit whose connection dropped after the job was queued
returns that job when asked again.

Login side only; nothing here imports the runtime, torch or submitit.
"""
