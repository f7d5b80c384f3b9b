"""Views of the reviews app: the queue (queue.py) and the change page (change.py)."""
