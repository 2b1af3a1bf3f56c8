"""A streaming query keeps the schema it started with (docs/spark.md, "Schema changes").

Spark fixes a stream's schema when the query starts: every micro-batch must have it. So a query started
before ``kvlease table alter`` reads the rows written after it as its own schema (common/codec_schemas.py:
by field id, a column added since left out, a renamed one under the name the query knows, a widened one
converted back where the value fits) and the driver says so, once, in its log; a restarted query takes
the table's schema then. :class:`SchemaCheck` looks at the table's schema id at most every
:data:`CHECK_INTERVAL_S` (one coordinator call).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from kvlease.common import errors
from kvlease.common.tables import TableInfo

log = logging.getLogger(__name__)

#: The longest a streaming query goes without looking at its table's schema id.
CHECK_INTERVAL_S = 10.0


class SchemaCheck:
    """Logs once that the table's schema changed after the query took its own (``table``)."""

    def __init__(self, table: TableInfo, clock: Callable[[], float] = time.monotonic) -> None:
        self.table = table
        self.clock = clock
        self.noted: int | None = None  # the schema id logged about
        self._due = 0.0

    def poll(self, admin) -> None:
        if self.noted is not None or self.clock() < self._due:
            return
        self._due = self.clock() + CHECK_INTERVAL_S
        try:
            now = admin.get_table_by_id(self.table.table_id)
        except errors.KvLeaseError:
            return  # not known now: asked again later
        if now.schema_id <= self.table.schema_id:
            return
        self.noted = now.schema_id
        added = [c.name for c in now.columns if c.id not in {k.id for k in self.table.columns}]
        log.warning("table %s changed to schema id %d after this streaming query took schema id %d: the query "
                    "keeps its schema (its columns %s; rows written since are read as it%s); restart the query "
                    "to read the table's new schema", now.path, now.schema_id, self.table.schema_id,
                    ", ".join(c.name for c in self.table.columns),
                    f", so the new column(s) {', '.join(added)} are not read" if added else "")
