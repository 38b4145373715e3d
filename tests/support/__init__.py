"""Helpers that several test packages share (STYLE: one helper, one place)."""
