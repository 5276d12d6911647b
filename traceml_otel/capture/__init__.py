"""Capture: clock readings on the training thread (recorder), the hooks that feed it, and the CUDA seam.

Nothing here builds OTel objects; completed steps leave in batches through ``emit.channel``.
"""
