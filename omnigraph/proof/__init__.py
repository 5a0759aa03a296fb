"""What the compiler proves before anything runs: the invariants (validate), the delays the schedule inserts, the firing schedule and the staleness bound."""
