"""The node-local checkpoint tier: each node saves to its own disk (``tier``), copies to a partner node
over TCP (``peer_copy``) and drains to shared storage; a restart restores from the nodes' own copies,
else from a partner's, else from shared storage. Part of ``checkpoint/``, under the same rules."""
