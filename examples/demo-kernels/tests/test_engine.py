import threading
import unittest

from engine import ep
from engine.kv import Transfer


class NullTracer:
    def span(self, name):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class EngineTest(unittest.TestCase):
    def test_a_transfer_finishes_its_chunks(self):
        done = Transfer(NullTracer()).send(3)
        self.assertTrue(done.wait(timeout=10))

    def test_dispatch_waits_either_way(self):
        saved = ep.RELEASE_GIL
        try:
            for release in (False, True):
                ep.RELEASE_GIL = release
                finished = threading.Event()
                worker = threading.Thread(target=lambda: (ep.dispatch(1.0), finished.set()))
                worker.start()
                worker.join(timeout=10)
                self.assertTrue(finished.is_set())
        finally:
            ep.RELEASE_GIL = saved


if __name__ == "__main__":
    unittest.main()
