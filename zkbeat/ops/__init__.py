"""What operators use: the zkbeat command, status, metrics and the dashboard."""
