"""What `all` leaves against vLLM-CPU at the goal depth, by component (the depth study's measurement)."""
