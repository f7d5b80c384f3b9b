"""Changes, their risk, the review queue and the merge."""
