"""The marketplace's word against what runs: the plan, the reconcile, recovery after an outage."""
