"""SQL storage of the control plane: models, engine and sessions, queries."""
