"""The pure analysis behind dense feedback: statistics, correctness comparison, traces,
criteria, samples, charts and the findings built from them.

Plain functions on plain data: nothing here imports Django or Celery (a test holds it), so a
worker, a bench script or a CLI can use any module without settings.
"""
