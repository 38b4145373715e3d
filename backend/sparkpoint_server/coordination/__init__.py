"""Checkpoint coordination for connected jobs: the authority of DESIGN section 1."""
