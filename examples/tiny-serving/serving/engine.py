"""A toy batching engine: real CPU work whose cost depends on the batch size."""

DISPATCH_OVERHEAD = 10_000  # loop iterations per batch (launch, scheduling)
PER_REQUEST = 500  # loop iterations per request
WORKING_SET = 156  # iterations per request, per request in the batch (cache pressure)


def spin(iterations: int) -> int:
    total = 0
    for i in range(iterations):
        total += i & 7
    return total


def serve(requests: int, batch_size: int) -> int:
    """Serve `requests` requests in batches; returns a checksum so nothing is optimised away."""
    checksum = 0
    for start in range(0, requests, batch_size):
        size = min(batch_size, requests - start)
        checksum += spin(DISPATCH_OVERHEAD + size * PER_REQUEST + size * size * WORKING_SET)
    return checksum
