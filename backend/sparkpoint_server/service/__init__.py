"""The authority for connected jobs: events, timer ticks and requests as units of work."""
