# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Facts about a host's MPS setup: NVML, GPUs, every daemon under a root, its servers and limits.

Reads only: no file, process, GPU or daemon setting is ever changed, no lock is taken, and a run never waits behind
another module's. :class:`Collector` reads the host once into a view (the same reader as every other module's,
_observe.reader), and the facts are a rendering of that view (:mod:`._info_facts`).

Everything a daemon is asked goes through ONE control UI process. Which of its children are servers
is only known from ``get_server_list``, in the same batch, so each child is asked about as if it
were one; ``_control`` frames the replies so that the error texts a non-server gets (undocumented,
possibly empty) cannot shift them.
"""

from __future__ import annotations

import os
import typing as t
from dataclasses import dataclass

from ._attribution import attribute
from ._errors import DaemonTimeoutError, DriverUpgradePendingError, InvalidParameterError, MpsError, NvmlError
from ._gpus import MPS_ENUMERATION_VAR, Gpu, Nvml
from ._info_facts import render
from ._limits.model import slice_env
from ._observe.reader import Wants, read_daemon, read_host, read_process
from ._observe.view import HostView
from ._proc import process_uid
from ._protocol.framing import ControlClient
from ._resource.layout import DEFAULT_CONTAINER_ROOT, SHM_DIR, config_paths, container_view, resource_paths, validate_root

GATHER_CHOICES = ('gpus', 'daemons', 'servers')


# --- the whole host -----------------------------------------------------------------------------
def nvml_facts(nvml_factory: t.Callable[[], Nvml]) -> t.Tuple[t.Dict[str, t.Any], t.List[Gpu], bool]:
    """(nvml facts, GPUs, whether NVML_MPS_DEVICE_ENUMERATION was set). Never raises for a missing driver."""
    facts: t.Dict[str, t.Any] = {'available': False, 'error': None, 'driver_version': None, 'cuda_driver_version': None,
                                 'driver_upgrade_pending': False}
    gpus: t.List[Gpu] = []
    enumeration_set = MPS_ENUMERATION_VAR in os.environ
    nvml = nvml_factory()
    # A missing nvidia-ml-py is a broken interpreter, not a host without a GPU: callers tell the two apart.
    facts['python_binding'] = nvml.has_binding
    try:
        with nvml:
            facts['driver_version'] = nvml.driver_version()
            facts['cuda_driver_version'] = nvml.cuda_driver_version()
            gpus = list(nvml.gpus())
    except NvmlError as exc:
        facts['error'] = exc.msg
        facts['driver_upgrade_pending'] = isinstance(exc, DriverUpgradePendingError)
        return facts, [], enumeration_set or nvml.enumeration_var_was_set
    facts['available'] = True
    return facts, gpus, enumeration_set or nvml.enumeration_var_was_set


@dataclass
class InfoRequest:
    """The validated options of one mps_info run."""

    root: str
    config_dir: str
    name: t.Optional[str]
    gather: t.FrozenSet[str]
    control_binary: t.Optional[str]
    timeout: float
    container_root: str = DEFAULT_CONTAINER_ROOT
    # The container view's slice: the environment one of this many clients sets to take 1/slices of each GPU (None: none).
    slices: t.Optional[int] = None

    @classmethod
    def validate(cls, root: str, config_dir: str, name: t.Optional[str], gather: t.Sequence[str],
                 control_binary: t.Optional[str], timeout: float,
                 container_root: str = DEFAULT_CONTAINER_ROOT, slices: t.Optional[int] = None) -> 'InfoRequest':
        if not gather:
            raise InvalidParameterError('gather', 'must name at least one of %s' % ', '.join(GATHER_CHOICES))
        unknown = sorted(set(gather) - set(GATHER_CHOICES))
        if unknown:
            raise InvalidParameterError('gather', 'unknown %s; choose from %s' % (', '.join(unknown), ', '.join(GATHER_CHOICES)))
        if timeout <= 0:
            raise InvalidParameterError('timeout', 'must be a positive number of seconds, got %s' % timeout)
        root = validate_root(root)
        if name is not None:
            resource_paths(root, name)
        config_dir = validate_root(config_dir, 'config_dir')
        container_root = validate_root(container_root, 'container_root')
        if name is not None:
            container_view(resource_paths(root, name), container_root)
        wanted = frozenset(gather)
        if 'servers' in wanted:
            wanted = wanted | {'daemons'}
        if slices is not None:
            slice_env(slices, [])  # refused here, naming slices, before anything is read
        return cls(root, config_dir, name, wanted, control_binary, timeout, container_root, slices)


@dataclass
class Report:
    """The module's result, less ``changed``, and its warnings."""

    facts: t.Dict[str, t.Any]
    warnings: t.List[str]
    ui_processes: int = 0


class Collector:
    """Gathers the facts of one host: reads it once, then renders the facts from what it read."""

    def __init__(self, request: InfoRequest, nvml_factory: t.Callable[[], Nvml] = Nvml,
                 uid_of: t.Callable[[int], t.Optional[int]] = process_uid) -> None:
        self.request = request
        self.nvml_factory = nvml_factory
        self.uid_of = uid_of
        self.ui_processes = 0

    def collect(self) -> Report:
        nvml, gpus, enumeration_set = nvml_facts(self.nvml_factory)
        facts, warnings = render(self.request, self.observe(gpus), nvml, enumeration_set=enumeration_set)
        return Report(facts, warnings, self.ui_processes)

    def observe(self, gpus: t.Sequence[Gpu]) -> HostView:
        """The host read once: the root and config directory, the mount table, every reported daemon's one control batch
        and its process; sealed."""
        request = self.request
        named = [(resource_paths(request.root, request.name), config_paths(request.config_dir, request.name))] if request.name else []
        wants = Wants().add(dirs=[os.path.join(request.root, SHM_DIR)])
        wants.mounts = True
        view = read_host(request.root, gpus, named, wants, config_dir=request.config_dir)
        if 'daemons' in request.gather:
            for name, seen in sorted(view.resources.items()):
                if request.name not in (None, name) or not (seen.liveness.running and seen.liveness.pid):
                    continue
                record = seen.record if seen.problem is None else None
                read_process(view, seen.liveness.pid, seen.paths.shm_dir, record_known=record is not None)
                static = record.static_partitioning if record is not None else bool(view.static_args.get(seen.liveness.pid))
                self._ask(view, seen, len(record.devices) if record is not None else 0, static=static)
        return view.seal()

    def _ask(self, view: HostView, seen: t.Any, ordinals: int, *, static: bool) -> None:
        """One UI process for everything the daemon can tell; a silent or broken daemon is recorded, not raised."""
        paths = seen.paths
        if not self.request.control_binary:
            view.failures[paths.name] = 'nvidia-cuda-mps-control was not found on PATH: the daemon cannot be asked anything'
            return
        client = ControlClient(self.request.control_binary, paths.pipe_dir, timeout=self.request.timeout, log_dir=paths.log_dir)
        try:
            try:
                readout = read_daemon(view, paths.name, client.batch, ordinals, seen.liveness.pid, partitions=static,
                                      servers='servers' in self.request.gather, client=client,
                                      config=config_paths(self.request.config_dir, paths.name))
            finally:
                self.ui_processes += client.processes
        except DaemonTimeoutError:
            view.failures[paths.name] = 'accepted the connection but did not answer within %ss (see %s)' % (
                _seconds(self.request.timeout), os.path.join(paths.log_dir, 'control.log'))
            return
        except MpsError as exc:
            view.failures[paths.name] = exc.msg
            return
        except UnicodeDecodeError as exc:
            view.failures[paths.name] = 'the control UI printed unreadable output (%s)' % exc
            return
        for server in getattr(readout, 'servers', ()):  # a v3 daemon's readout lists its server's clients instead
            view.uids[server.pid] = self.uid_of(server.pid)
        for found in view.clients[paths.name][1]:  # with the uid read_daemon read: whose each client is (issue 44)
            if found['pid'] not in view.owners:
                view.owners[found['pid']] = attribute(found['pid'], found['uid'])


def _seconds(value: float) -> str:
    return ('%d' % value) if float(value).is_integer() else ('%s' % value)
