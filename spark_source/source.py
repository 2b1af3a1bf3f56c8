"""The ``kvlease`` Python Data Source: schema, readers and writers from the options.

Spark instantiates it in its Python workers; every method checks the options
first, so an unknown option or a bad value fails the query at planning with
a message naming it. Spark puts the traceback of a source's error in the
exception it raises; an option error leaves the source with none of its
frames below the method Spark called
(:func:`~kvlease.spark_source.user_errors.option_errors`), so that the user
reads one line, kvlease's, not the parser's insides.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from functools import cached_property

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from kvlease.common.tables import TableInfo
import kvlease.spark_source.options as opts
import kvlease.spark_source.catalog as catalog
from kvlease.spark_source.batch import (BatchReader, check_partition_names, check_prefix_option, partitioned_reader,
                                       unpartitioned_reader)
from kvlease.spark_source.schema import read_columns, table_schema
from kvlease.spark_source.splits import ReadContext
from kvlease.spark_source.stream import StreamReader
from kvlease.spark_source.user_errors import option_errors
import kvlease.spark_source.write_options as write_options
from kvlease.spark_source.writer import BatchWriter, StreamWriter, check_schema


class KvLeaseDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "kvlease"

    @cached_property
    def _given(self) -> dict[str, str]:
        """The options: a ``CREATE TABLE``'s OPTIONS, or those of the read or write (:mod:`kvlease.spark_source.catalog`).
        A read of a catalog table replaces them with the table's own first (:meth:`_read_options`)."""
        if catalog.is_create(self.options):
            return catalog.from_create(self.options)
        return {str(k).lower(): str(v) for k, v in self.options.items()}

    @cached_property
    def _cluster(self) -> tuple[TableInfo, object]:
        """The table and the remote storage, from the coordinator."""
        bootstrap, table, security = opts.connection(self._given)
        with opts.connect(bootstrap, security) as admin:
            return admin.get_table(table), admin.coordinator_info(admin.address).remote_storage()

    @option_errors
    def schema(self) -> StructType:
        """The table's columns and the four metadata columns. Spark asks one schema for batch and
        streaming reads alike, so a full batch read carries them too (docs/spark.md, "Output columns"). A
        ``CREATE TABLE``'s schema keeps the OPTIONS, for the table's later reads; merge engine options that
        disagree with the table's refuse it (as they refuse a write)."""
        opts.parse(self._given)
        schema = table_schema(self._cluster[0], with_changes=True)
        if not catalog.is_create(self.options):
            return schema
        write_options.check_engine(self._given, self._cluster[0])
        return catalog.remember(schema, self._given)

    def _read_options(self, schema: StructType) -> opts.Options:
        """The read's options, checked; a catalog table's read takes the table's own from ``schema``."""
        self.__dict__["_given"] = catalog.recall(self._given, schema)
        try:
            return opts.parse(self._given)
        except opts.OptionError as exc:
            raise opts.OptionError(f"{exc}{catalog.no_table_hint(self._given)}") from None

    def _context(self, parsed: opts.Options, schema: StructType) -> ReadContext:
        table, storage = self._cluster
        try:
            columns = read_columns(table, schema)
        except ValueError as exc:
            raise opts.OptionError(f"the schema given to the reader does not fit: {exc}") from None
        return ReadContext(parsed.bootstrap, table, storage, columns, parsed.security,
                           tuple(field.nullable for field in schema.fields), parsed.lease_duration_ms)

    @option_errors
    def reader(self, schema: StructType) -> BatchReader:
        """A partitioned table's reader reads the partitions option ``partitions`` names, else every one
        (``batch.py``)."""
        parsed = self._read_options(schema)
        table = self._cluster[0]
        if table.partitioned and parsed.ending_offsets is not None:
            raise opts.OptionError(f"option 'ending.offsets' names buckets of an unpartitioned table; table "
                                   f"{table.path} is partitioned: end its change feed with 'ending.timestamp'")
        check_partition_names(table, parsed.partitions)
        check_prefix_option(table, parsed)
        reader = partitioned_reader() if table.partitioned else unpartitioned_reader()
        return reader(parsed, self._context(parsed, schema))

    @option_errors
    def streamReader(self, schema: StructType) -> StreamReader:
        parsed = self._read_options(schema)
        if parsed.bootstrap_mode == "live":
            raise opts.OptionError("option 'bootstrap.mode'=live is for batch reads only: a live scan cannot be "
                                   "replayed, so a streaming query could not be exactly-once; use "
                                   "bootstrap.mode=snapshot")
        for name in ("ending.timestamp", "ending.offsets"):
            if name in parsed.given:
                raise opts.OptionError(f"option '{name}' ends a batch change feed; a streaming query has no end")
        if parsed.partitions:
            raise opts.OptionError("option 'partitions' selects partitions for a batch read; a streaming query "
                                   "reads every partition of the table, those created later too")
        if parsed.prefix is not None:
            raise opts.OptionError("option 'prefix' narrows a batch read of the table; a streaming query reads "
                                   "every row's changes")
        at = parsed.startup_timestamp_ms
        if parsed.startup_mode == "timestamp" and at > time.time() * 1000:
            # the first record at or after it does not exist yet: starting at the end would read the
            # changes appended until then, which are before it
            try:
                when = datetime.fromtimestamp(at / 1000, timezone.utc).isoformat(timespec="milliseconds")
            except (OverflowError, ValueError, OSError):  # beyond the year 9999
                when = f"{at} ms since the epoch"
            raise opts.OptionError(f"option 'startup.timestamp': {when} is in the future; a stream starts at a "
                                   "time that has passed (startup.mode=latest reads from now on)")
        return StreamReader(parsed, self._context(parsed, schema))

    @option_errors
    def writer(self, schema: StructType, overwrite: bool) -> BatchWriter:
        return BatchWriter(*self._write_setup(schema, overwrite))

    @option_errors
    def streamWriter(self, schema: StructType, overwrite: bool) -> StreamWriter:
        return StreamWriter(*self._write_setup(schema, overwrite))

    def _write_setup(self, schema: StructType, overwrite: bool) -> tuple:
        if overwrite:
            raise opts.OptionError("mode 'overwrite' is not supported (nor INSERT OVERWRITE, writeTo().overwrite()): "
                                   "kvlease upserts by primary key; use mode('append') or INSERT INTO")
        opts.check_names(self._given, reading=False)  # first: a misspelt 'table' is told so
        if not self._given.keys() & catalog.LOCATING:
            raise opts.OptionError(catalog.WRITE_NEEDS_OPTIONS)
        parsed = opts.parse(self._given, reading=False)
        table = self._cluster[0]
        given = {str(k).lower(): str(v) for k, v in self._given.items()}
        write_options.check_engine(given, table)
        partial = write_options.partial_update(given)
        return parsed.bootstrap, table, check_schema(table, schema, partial), parsed.security, partial
