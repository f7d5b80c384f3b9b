"""Audit entries for the admin editor: what a saved form or inline changed, field by field.

Contracts:
- One entry per changed object; a save that changed nothing writes none.
- ``data`` holds JSON values only: related objects by primary key, decimals as text.
  A change is ``{"changed": {field: [old, new]}}``, an addition ``{"created": {field: value}}``,
  a deletion ``{"deleted": {field: value}}`` with the row as it was before.
- Call inside the admin's transaction (its change and delete views are atomic), so the entry
  and the save commit together.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.forms import BaseModelForm, BaseModelFormSet
from django.forms.formsets import DELETION_FIELD_NAME, ORDERING_FIELD_NAME
from django.forms.models import model_to_dict

from infraops.models import AuditEntry
from infraops.roles import AnyUser
from infraops.services.audit import audit_record

_FORMSET_FIELDS = {DELETION_FIELD_NAME, ORDERING_FIELD_NAME}


class _Encoder(DjangoJSONEncoder):
    def default(self, o: Any) -> Any:
        # Inline forms clean their parent link to the parent object itself.
        if isinstance(o, models.Model):
            return o.pk
        return super().default(o)


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value, cls=_Encoder))


def _same(old: Any, new: Any) -> bool:
    # Browsers submit textareas with CRLF line ends; rows written elsewhere have LF. The lines
    # are what counts (goal specs strip each line), so this is not a change of the field.
    if isinstance(old, str) and isinstance(new, str):
        return old.replace("\r\n", "\n") == new.replace("\r\n", "\n")
    return bool(old == new)


def form_changes(form: BaseModelForm[Any]) -> dict[str, list[Any]]:
    """``{field: [old, new]}`` for each field of a bound, valid form that changed; {} if none.

    Old is what the page showed (the form's initial value), new what the form cleaned.
    """
    changes: dict[str, list[Any]] = {}
    for name in form.changed_data:
        if name in _FORMSET_FIELDS or name not in form.cleaned_data:
            continue
        field = form.fields[name]
        old = _json(field.prepare_value(form.get_initial_for_field(field, name)))
        new = _json(field.prepare_value(form.cleaned_data[name]))
        if not _same(old, new):
            changes[name] = [old, new]
    return changes


def form_values(form: BaseModelForm[Any]) -> dict[str, Any]:
    """Every field a bound, valid form saved (its primary key aside), as JSON values."""
    skip = _FORMSET_FIELDS | {form._meta.model._meta.pk.name}
    return {
        name: _json(form.fields[name].prepare_value(value))
        for name, value in form.cleaned_data.items()
        if name in form.fields and name not in skip
    }


def record_values(obj: models.Model, fields: list[str] | None = None) -> dict[str, Any]:
    """The row's editable fields (or `fields`), as JSON values: what a deletion took away."""
    return _json(model_to_dict(obj, fields=fields))  # type: ignore[no-any-return]


def audit_form_save(
    *,
    user: AnyUser,
    action: str,
    form: BaseModelForm[Any],
    created: bool,
    data: dict[str, Any] | None = None,
) -> AuditEntry | None:
    """Record a saved admin form: its values when `created`, else its changed fields.

    Returns None, writing nothing, when an edit changed no field. `data` is merged in.
    """
    if created:
        what: dict[str, Any] = {"created": form_values(form)}
    else:
        changes = form_changes(form)
        if not changes:
            return None
        what = {"changed": changes}
    return audit_record(actor=user, action=action, obj=form.instance, data={**(data or {}), **what})


def formset_save_audited(
    *,
    user: AnyUser,
    formset: BaseModelFormSet[Any, Any],
    noun: str,
    data: dict[str, Any] | None = None,
) -> list[AuditEntry]:
    """Save an admin inline formset and record ``<noun>.add``, ``.change`` and ``.delete``,
    one entry per row added, changed or deleted, each with the row's description.

    Deleted rows are re-read before the save: their forms' instances already carry the
    submitted values, not what is being deleted.
    """
    doomed = {form: form.instance.pk for form in formset.deleted_forms
              if form.instance.pk is not None}
    rows = formset.model._default_manager.in_bulk(list(doomed.values()))
    formset.save()
    extra = data or {}
    entries = []
    for form in formset.initial_forms:
        if form in doomed:
            row = rows.get(doomed[form])
            if row is not None:
                entries.append(audit_record(
                    actor=user, action=f"{noun}.delete", obj=row,
                    data={**extra, "description": str(row), "deleted": record_values(row)},
                ))
            continue
        entry = audit_form_save(user=user, action=f"{noun}.change", form=form, created=False,
                                data={**extra, "description": str(form.instance)})
        if entry is not None:
            entries.append(entry)
    for form in formset.extra_forms:
        if form.instance.pk is None:  # left empty, or added and ticked for deletion at once
            continue
        added = audit_form_save(user=user, action=f"{noun}.add", form=form, created=True,
                                data={**extra, "description": str(form.instance)})
        if added is not None:
            entries.append(added)
    return entries
