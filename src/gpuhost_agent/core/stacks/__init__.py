"""A stack's life: jobs dispatched, deployed and removed through a backend, every step reported."""
