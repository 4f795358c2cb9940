"""The GPUs: which rental holds which, how they are handed out, and their faults."""
