"""Reading job events from Redis into the control plane."""
