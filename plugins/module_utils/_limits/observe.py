# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Of :class:`.manager.LimitsManager`: what its decision reads of the host, and mps_limits' own run (its view read under
the resource's lock, the decision, the one executor)."""

from __future__ import annotations

import typing as t

from .._errors import MpsError
from .._gpus import Gpu, all_devices
from .._observe.reader import read_daemon, read_help, read_host, read_process
from .._observe.scan import orphan_warnings
from .._protocol.commands import SET_DEFAULT_PRIORITY, SM_PARTITION
from .._resource.lock import resource_lock
from .decide import ServerLimits


class LimitsObserve:
    """Needs the manager's paths, config, daemon, gpus, check mode, view, prober and its decision (``_check``, ``_plan``)."""

    paths: t.Any
    config: t.Any
    daemon: t.Any
    gpus: t.List[Gpu]
    check_mode: bool
    view: t.Any
    prober: t.Any
    missing_binary: t.Optional[MpsError]
    sm_partitions: t.Any
    client_priority: t.Any
    static_running: bool
    scope: t.Callable[..., t.Tuple[t.List[Gpu], bool, t.Optional[int]]]
    _check: t.Callable[..., None]
    _plan: t.Callable[..., t.Any]

    def read(self, scope: t.Sequence[Gpu],
             pid: t.Optional[int]) -> t.Tuple[t.Optional[float], t.Dict[int, t.Optional[str]], t.List[ServerLimits], t.Any]:
        """Defaults and every server's limits, as the run's one control batch of the daemon read them."""
        readout = self.view.answered(self.view.readouts, self.paths.name, 'the limits of %s' % self.paths.name)
        if readout[0] != (len(scope), pid) or (self.static_running and readout[1].lspart_text is None):
            raise MpsError('internal error: the limits of %s were read for %s, not for %s' % (
                self.paths.name, readout[0], (len(scope), pid)))
        return self._as_read(readout[1])

    def probe(self, view: t.Any) -> None:
        """What the decision about these limits needs beyond the files, read into ``view`` before it is sealed: the
        running daemon's one control batch (its defaults for its devices, its servers, its partitions where started with
        -S), its process, and - where a wanted limit needs a command its binary may lack and no daemon answered - the
        binary's help text."""
        self.view = view
        seen = view.resource(self.paths.name)
        if seen.problem is None and seen.state.running and seen.state.pid:
            read_process(view, seen.state.pid, None, record_known=seen.record is not None)
        scope, running, pid = self.scope(create=True)
        prober = self.prober or self.daemon
        missing = self.missing_binary
        if running and self.daemon is None and missing is not None:
            # a running daemon needs the control binary: why there is none, as it was said
            raise MpsError(missing.msg, **missing.details)
        if running and pid and self.daemon is not None:
            if self.paths.name not in view.readouts or view.readouts[self.paths.name][0] != (len(scope), pid):
                read_daemon(view, self.paths.name, self.daemon.query, len(scope), pid, self.static_running)
            self.daemon.answered = True
            if self.sm_partitions and not self.static_running and prober is not None:
                read_help(view, prober, SM_PARTITION)  # a daemon without -S cannot say: its binary's help can
            return
        if prober is None:
            return
        if self.client_priority is not None:
            read_help(view, prober, SET_DEFAULT_PRIORITY)
        if self.sm_partitions:
            read_help(view, prober, SM_PARTITION)

    @staticmethod
    def _as_read(readout: t.Any) -> t.Tuple[t.Optional[float], t.Dict[int, t.Optional[str]], t.List[ServerLimits], t.Any]:
        servers = [ServerLimits(server.pid, server.active_thread_percentage, dict(enumerate(server.pinned_device_mem_limit)))
                   for server in readout.servers]
        return readout.default_percentage, dict(enumerate(readout.default_mem)), servers, readout

    def ensure(self, percentage: t.Any, mem: t.Any, replicas: t.Any, running_servers: str, *, persist_limits: bool,
               create: bool) -> t.Any:
        """mps_limits: read the resource under its lock (the lock belongs to the resource, not to its daemon: taken whether
        or not one runs, so a concurrent mps_daemon start never replays a half-written record), decide, and (unless in
        check mode) execute exactly that; a refused run leaves nothing behind, not even the lock it made."""
        self._check(percentage, mem, replicas, running_servers)
        # Imported here: mps_host, which imports this module on every run, executes through its own caller.
        from .._execute import execute  # pylint: disable=import-outside-toplevel
        if self.check_mode:
            self.observe_own()
            return self._reported(self._plan(percentage, mem, replicas, running_servers, persist_limits=persist_limits, create=create))
        with resource_lock(self.paths) as lock:
            self.observe_own()
            try:
                out = self._plan(percentage, mem, replicas, running_servers, persist_limits=persist_limits, create=create)
            except MpsError:
                lock.discard()
                raise
            execute(self._reported(out))
            out.ui_processes = self.daemon.client.processes if self.daemon else 0
            return out

    def _reported(self, out: t.Any) -> t.Any:
        """The root's orphans said, never acted on (gpufleet.mps.mps_host does)."""
        out.warnings += orphan_warnings(self.view.orphans(), all_devices(self.gpus))
        return out

    def observe_own(self) -> None:
        """The resource read once for mps_limits' own run (mps_host reads a whole host, :meth:`probe` each resource)."""
        view = read_host(self.paths.root, self.gpus, [(self.paths, self.config)])
        self.probe(view)
        self.view = view.seal()
