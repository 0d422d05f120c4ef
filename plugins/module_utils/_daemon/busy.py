# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Clients connected to a daemon that must stop: refuse, wait for them to leave, or end them."""

from __future__ import annotations

import time
import typing as t

from .._errors import MpsError
from .._outcome import Outcome
from .._observe.reader import clients_of
from .._proc import child_pids
from .._protocol.batch import read_batch
from .._supervisor.liveness import Liveness
from .model import DaemonOutcome, DaemonRun

BUSY_POLL = 0.5


class BusyClients:
    """The clients of a daemon that a run stops: refused, waited for or ended, as ``busy`` says."""

    def __init__(self, run: DaemonRun) -> None:
        self.run = run

    def connected(self, pid: t.Optional[int]) -> t.List[t.Dict[str, t.Any]]:
        """The clients of the daemon's servers, as the daemon lists them now (one UI process; a v3 daemon: its server's)."""
        v3 = self.run.view.v3.get(self.run.paths.name)
        if v3 is not None:
            from .._v3.control import read_v3  # pylint: disable=import-outside-toplevel
            return [{'pid': client, 'server': v3[1].server} for client, _namespace in read_v3(self.run.daemon.client, v3[1].server).clients]
        return clients_of(read_batch(self.run.daemon.query, 0, child_pids(pid) if pid else []))

    def observed(self, pid: t.Optional[int]) -> t.List[t.Dict[str, t.Any]]:
        """The clients of the running daemon ``pid`` as the run's view read them (its one control batch)."""
        view = self.run.view
        name = self.run.paths.name
        found = view.answered(view.clients, name, 'the clients of %s' % name)
        if found[0] != pid:
            raise MpsError('internal error: the clients of %s were read for pid %s, not %s' % (name, found[0], pid))
        return list(found[1])

    def plan(self, current: Liveness, out: Outcome, change: str) -> None:
        """Connected clients would be ended by this stop: refuse (the default), wait for them, or go on and end them."""
        run = self.run
        clients = self.observed(current.pid)
        if not clients:
            return
        if isinstance(out, DaemonOutcome):
            out.clients = clients
        named = ', '.join('pid %d (uid %s) on server %s' % (client['pid'], client['uid'], client['server']) for client in clients)
        if run.busy == 'refuse':
            raise MpsError('busy: %s of the MPS control daemon for %s (pid %s) would end its %d connected client(s) - %s; '
                           'nothing was done. Set busy=wait to wait up to busy_timeout seconds for them to leave, or '
                           'busy=terminate to end them' % (change, run.paths.name, current.pid, len(clients), named),
                           clients=clients)
        run.planned.ends_clients = run.busy == 'terminate'
        if run.busy == 'wait':
            out.act('wait up to %ds for %d connected client(s) to leave - %s' % (run.busy_timeout, len(clients), named),
                    lambda: self.wait_idle(current.pid, change))
        else:
            out.warnings.append('%s of the MPS control daemon for %s %s its %d connected client(s) (busy=terminate) - %s' % (
                change, run.paths.name, 'would end' if run.check_mode else 'ends', len(clients), named))

    def wait_idle(self, pid: t.Optional[int], change: str) -> None:
        run = self.run
        deadline = time.monotonic() + run.busy_timeout
        while True:
            clients = self.connected(pid)
            if not clients:
                return
            if time.monotonic() >= deadline:
                raise MpsError('busy: the MPS control daemon for %s (pid %s) still has %d connected client(s) after %ds - %s; '
                               '%s was not done (busy=wait)' % (
                                   run.paths.name, pid, len(clients), run.busy_timeout,
                                   ', '.join('pid %d' % client['pid'] for client in clients), change), clients=clients)
            run.daemon.sleep(BUSY_POLL)
