"""The event loop's data-loss requests, handed on by the controller (docs/replication.md, "Lost data").

Barriers all (gathered lease writes are persisted first): a tablet server reporting a lost replica, its
bucket leaders' log ends or a restore carried out (their buckets named by physical id:
common/tables.py), and an operator restoring a bucket or electing its leader (named by table and
partition ids, resolved here).
"""

from __future__ import annotations

from concurrent.futures import Future

from kvlease.common.statemachine import Dispatcher, on
from kvlease.coordinator import requests as rq
from kvlease.coordinator.catalog import TableCatalog
from kvlease.coordinator.data_loss import DataLossShell
from kvlease.coordinator.lease_shell import LeaseShell
from kvlease.coordinator.loop import settle


class DataLossRequests(Dispatcher):
    def __init__(self, losses: DataLossShell, catalog: TableCatalog, lease_shell: LeaseShell) -> None:
        self.losses = losses
        self.catalog = catalog
        self.lease_shell = lease_shell

    def handles(self, request: object) -> bool:
        return type(request) in self._handlers

    def _answer(self, future: Future | None, step) -> None:
        self.lease_shell.flush()
        settle(future, step())

    @on(rq.ReportReplicaLoss)
    def _replica_lost(self, r: rq.ReportReplicaLoss, future: Future | None) -> None:
        self._answer(future, lambda: self.losses.replica_lost(r.server_id, r.table_id, r.bucket, r.reason))

    @on(rq.ReportLogEnds)
    def _log_ends(self, r: rq.ReportLogEnds, future: Future | None) -> None:
        self._answer(future, lambda: self.losses.log_ends_reported(r.server_id, list(r.ends), r.takeover))

    @on(rq.ConfirmRestore)
    def _restore_confirmed(self, r: rq.ConfirmRestore, future: Future | None) -> None:
        self._answer(future, lambda: self.losses.restore_confirmed(r.server_id, r.table_id, r.bucket, r.leader_epoch))

    @on(rq.RestoreBucket)
    def _restore_bucket(self, r: rq.RestoreBucket, future: Future | None) -> None:
        def restore():
            view = self.catalog.resolve(r.table_id, r.partition_id)
            return self.losses.restore(view.physical_id, r.bucket, r.accept_data_loss, r.tablet)
        self._answer(future, restore)

    @on(rq.ElectLeader)
    def _elect_leader(self, r: rq.ElectLeader, future: Future | None) -> None:
        def elect():
            view = self.catalog.resolve(r.table_id, r.partition_id)
            return self.losses.elect(view.physical_id, r.bucket, r.unclean, r.tablet)
        self._answer(future, elect)
