"""Sparkpoint's dashboard: a Plotly Dash app that shows and steers checkpoints via the REST API."""
