"""Sparkpoint's control plane: ingests job events from Redis, coordinates checkpoints, serves
the REST API."""
