"""The REST API: one router per resource."""
