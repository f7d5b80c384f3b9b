"""Signals the core sends so that apps above it can react without the core importing them."""

from __future__ import annotations

from django.dispatch import Signal

# Sent after the commit that finishes an experiment; kwargs: experiment_id.
experiment_finished = Signal()
