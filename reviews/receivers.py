"""Reactions of the reviews app to the core's signals."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from infraops.signals import experiment_finished


@receiver(experiment_finished)
def advance_reverified_changes(sender: Any, *, experiment_id: int, **kwargs: Any) -> None:
    """A change waiting on its re-verification moves on as soon as it finished (beat's
    reaper is the fallback when this notice is lost)."""
    from reviews.models import Change
    from reviews.tasks import change_advance

    for change_id in Change.objects.filter(status=Change.Status.REVERIFYING,
                                           reverify_experiment_id=experiment_id).values_list(
                                               "pk", flat=True):
        change_advance.delay(change_id)
