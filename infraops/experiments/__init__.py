"""Running experiments: the service that claims and executes them, the sandbox that runs each
probe, its results and the feedback analysis over them, the workers that carry them out."""
