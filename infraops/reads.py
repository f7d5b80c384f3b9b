"""Rows with their to-one relations, read by a statement built once per process.

`select_related` builds its SQL anew on every call. For a page's main object joined with four
tables that took the web process about a millisecond of CPU each time, several times what
PostgreSQL spent on the (prepared) statement (bench/load.py). A `JoinedRead` builds the same
statement once, from the models' metadata, and turns each row into the instances
`select_related` would give: each related object cached on its parent, so following the
relation asks nothing more of the database.

The statement's condition, order and limit are fixed when the read is made, written in SQL
over the table aliases: t0 is the model's table, t1, t2... the relations in the order the
paths name them; its values are bound, by position or by name. Only forward foreign keys and
one-to-ones may be followed; a nullable one is joined with LEFT JOIN and reads as None where
the row has none, as select_related has it. `only` names the fields read of the model ("")
or of a relation (its path), as QuerySet.only does: the others are deferred.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from django.db import connections, router
from django.db.models import ForeignKey, Model, QuerySet

M = TypeVar("M", bound=Model)


@dataclass
class _Node:
    """A model in the statement: its table alias and the relations joined to it."""

    model: type[Model]
    alias: str
    parent: _Node | None = None
    relation: ForeignKey[Any, Any] | None = None  # the field of the parent that leads here
    nullable: bool = False
    children: list[_Node] = field(default_factory=list)


@dataclass
class _Load:
    """How a node's columns become its instance: attribute names, the primary key's place,
    and the ORM's converters of the columns that have any (JSON, arrays, decimals...)."""

    node: _Node
    attnames: list[str]
    pk_index: int
    converters: list[tuple[int, list[Any], Any]]


class JoinedRead(Generic[M]):
    """`model.objects.select_related(*paths)` with a fixed condition (by default, the primary
    key), order and limit, without building the query each time."""

    def __init__(self, model: type[M], *paths: str, where: str = "", order_by: str = "",
                 limit: int | None = None, only: dict[str, tuple[str, ...]] | None = None,
                 ) -> None:
        self.model = model
        self._nodes = [_Node(model, "t0")]
        paths_of = {"t0": ""}
        for path in paths:
            paths_of[self._add(path).alias] = path
        self._only = {alias: only[path] for alias, path in paths_of.items()
                      if only is not None and path in only}
        self._clauses = (where or f't0."{model._meta.pk.column}" = %s') + \
            (f" ORDER BY {order_by}" if order_by else "") + \
            (f" LIMIT {int(limit)}" if limit is not None else "")
        self._plan: tuple[str, list[_Load]] | None = None

    def _add(self, path: str) -> _Node:
        node = self._nodes[0]
        for name in path.split("__"):
            relation = node.model._meta.get_field(name)
            if not isinstance(relation, ForeignKey):  # OneToOneField is one
                raise ValueError(f"{node.model.__name__}.{name} is not a forward foreign key: "
                                 "a JoinedRead follows only those.")
            child = next((c for c in node.children if c.relation is relation), None)
            if child is None:
                child = _Node(relation.related_model,  # type: ignore[arg-type]
                              f"t{len(self._nodes)}", node, relation,
                              nullable=node.nullable or relation.null)
                node.children.append(child)
                self._nodes.append(child)  # after its parent: instances are made in this order
            node = child
        return node

    def _fields(self, node: _Node) -> list[Any]:
        """The node's columns: every concrete field, or the primary key and those `only`
        names, in the model's order."""
        fields = list(node.model._meta.concrete_fields)
        named = self._only.get(node.alias)
        if named is None:
            return fields
        unknown = set(named) - {f.name for f in fields}
        if unknown:
            raise ValueError(f"{node.model.__name__} has no field {', '.join(sorted(unknown))}")
        return [f for f in fields if f.primary_key or f.name in named]

    def _statement(self, quote: Any) -> str:
        columns, joins = [], []
        for node in self._nodes:
            columns += [f"{node.alias}.{quote(f.column)}" for f in self._fields(node)]
            if node.parent is not None and node.relation is not None:
                remote = node.relation.target_field.column
                joins.append(f"{'LEFT' if node.nullable else 'INNER'} JOIN "
                             f"{quote(node.model._meta.db_table)} {node.alias} ON "
                             f"{node.alias}.{quote(remote)} = "
                             f"{node.parent.alias}.{quote(node.relation.column)}")
        # Identifiers from the models' metadata, quoted, and the clauses the code wrote; the
        # values are bound.
        return (f"SELECT {', '.join(columns)} "  # noqa: S608  # nosec B608
                f"FROM {quote(self.model._meta.db_table)} t0 {' '.join(joins)} "
                f"WHERE {self._clauses}")

    def _prepare(self, connection: Any) -> tuple[str, list[_Load]]:
        if self._plan is None:  # two threads may both build it: the same plan either way
            loads = []
            for node in self._nodes:
                fields = self._fields(node)
                converters = []
                for index, model_field in enumerate(fields):
                    expression = model_field.get_col(node.model._meta.db_table)
                    found = (connection.ops.get_db_converters(expression) +
                             expression.get_db_converters(connection))
                    if found:
                        converters.append((index, found, expression))
                loads.append(_Load(node, [f.attname for f in fields],
                                   fields.index(node.model._meta.pk), converters))
            self._plan = (self._statement(connection.ops.quote_name), loads)
        return self._plan

    def get(self, *params: Any) -> M | None:
        """The first row (by default: the one with this primary key), or None."""
        found = self.all(*params)
        return found[0] if found else None

    def all(self, *params: Any, **named: Any) -> list[M]:
        """Every row the statement selects, each with its relations; the values by position
        (%s) or by name (%(name)s)."""
        database = router.db_for_read(self.model)
        connection = connections[database]
        sql, loads = self._prepare(connection)
        with connection.cursor() as cursor:
            cursor.execute(sql, named or list(params))
            rows = cursor.fetchall()
        return [self._instance(row, loads, database, connection) for row in rows]

    @staticmethod
    def _instance(row: tuple[Any, ...], loads: list[_Load], database: str,
                  connection: Any) -> M:
        instances: dict[str, Model | None] = {}
        start = 0
        for load in loads:
            node = load.node
            values = list(row[start:start + len(load.attnames)])
            start += len(load.attnames)
            for index, converters, expression in load.converters:
                for converter in converters:
                    values[index] = converter(values[index], expression, connection)
            instance = (None if values[load.pk_index] is None else
                        node.model.from_db(database, load.attnames, values))
            instances[node.alias] = instance
            parent = instances[node.parent.alias] if node.parent is not None else None
            if parent is not None and node.relation is not None:
                node.relation.set_cached_value(parent, instance)
        return instances["t0"]  # type: ignore[return-value]


def give_related(instance: Model, name: str, rows: list[Any]) -> None:
    """Make `instance.<name>.all()` answer `rows` without a query, as prefetch_related leaves
    a reverse relation: the rows a JoinedRead read, in its order. The cached queryset is the
    relation's own, so anything chained on it (a filter, an order) asks the database, as
    after prefetch_related."""
    relation = instance._meta.get_field(name)
    cache = instance.__dict__.setdefault("_prefetched_objects_cache", {})
    cache.pop(relation.cache_name, None)  # type: ignore[union-attr]
    cached: QuerySet[Any] = getattr(instance, name).get_queryset()
    cached._result_cache = rows  # what prefetch_related sets
    cached._prefetch_done = True  # type: ignore[attr-defined]
    cache[relation.cache_name] = cached  # type: ignore[union-attr]
