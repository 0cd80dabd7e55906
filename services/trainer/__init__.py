"""Trainer wrapper: runs a user's PyTorch job under Loom (progress, checkpoint, resume, resize).

Arrives with the live cluster (issue 7); simulations use `services.nodeagent.simnode`.
"""
