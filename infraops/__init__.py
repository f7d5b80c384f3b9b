"""InfraOps core: targets, goals, boundaries, criteria, probes, experiments, feedback.

Importing this package starts nothing: the Celery application lives in the project package
(``infraops.project``), and the pure analysis (``infraops.feedback``) imports no Django.
"""
