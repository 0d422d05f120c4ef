# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The observe stage of a host plan: the host read once, before anything is decided (_observe.snapshot.HostSeen).

Every resource under the root, the /proc scan, the files and directories the plan compares, one control batch per
running daemon (its limits, servers and their clients), an orphan's servers, and - where systemd runs - every unit's
state from one ``systemctl show``, which the managers' systemctl answers from while the plan is decided.
"""

from __future__ import annotations

import typing as t

from .._observe.snapshot import HostSeen, observe_host
from .._proc import child_pids, read_mountinfo
from .._supervisor.unit import ObservedSystemctl, instance_unit
from .around import HEALTH_TIMER


def observe(host: t.Any, listed: t.List[t.Any], removed: t.List[t.Any]) -> t.Tuple[HostSeen, t.List[ObservedSystemctl]]:
    """``host`` (a HostManager) and its resources observed: (what was seen, the systemctl answering from it)."""
    resources = listed + removed
    files = [path for res in resources for path in (
        res.setup.config.env_file, res.setup.config.limits_json, res.setup.config.limits_file, res.setup.config.limits_env)]
    shm = host.shm = _shm_manager(host)
    files += shm.observed_files() if shm is not None else []
    files += [path for res in resources if res.setup.systemctl is not None
              for path in res.setup.manager(host.nvml, host.check_mode).unit_files()]
    seen = observe_host(host.root, (res.setup.paths for res in resources), host.nvml.gpus(),
                        files + host.around.observed_files(), [host.config_dir] + ([shm.path] if shm else []))
    host.seen = host.around.seen = seen  # the limits managers below read from it
    if shm is not None:
        shm.read_file, shm.list_dir, shm.mountinfo = seen.text, seen.listdir, read_mountinfo()
    units = _observe_units(host, resources, seen)
    for res in resources:
        res.seen = seen.resources[res.name]
    for res in listed:
        # The one control batch of each running daemon (defaults, servers, their limits and clients).
        host.limits_manager(res, assume_stopped=False).observe()
    if host.params['orphans'] == 'stop':
        # The MPS servers of each orphaned daemon of the root (ending it ends them: busy decides).
        seen.orphan_servers = {daemon.pid: child_pids(daemon.pid) for daemon in seen.daemons[0] if daemon.orphan}
    for res in resources:
        # A daemon the plan stops or moves: its servers' clients, which busy decides about.
        if res.seen.state.running and res.seen.state.pid and res.name not in seen.clients:
            seen.read_daemon(res.name, res.setup.daemon.query, 0, res.seen.state.pid)
            res.setup.daemon.answered = True
    return seen, units


def _shm_manager(host: t.Any) -> t.Optional[t.Any]:
    """The shared tmpfs's manager, for a host with shm and for a teardown; None for neither."""
    p = host.params
    absent = p['state'] == 'absent'
    if not (p['shm'] or absent):
        return None
    # Imported here: only hosts with shm, and teardowns, need it.
    from .._shm import ShmManager  # pylint: disable=import-outside-toplevel
    manager = ShmManager.for_host(host.root, 'absent' if absent else 'mounted', p['shm_persist'], '/etc/fstab', host.unit_dir,
                                  host.check_mode, p['selinux_type'], param='shm_persist')
    # The plan stops every daemon of the root before the unmount.
    manager.daemons_stop_first = absent
    return manager


def _observe_units(host: t.Any, resources: t.List[t.Any], seen: HostSeen) -> t.List[ObservedSystemctl]:
    """Where systemd runs: every resource's unit and the health timer, active and enabled, in ONE systemctl process;
    each systemctl of the plan is replaced by one that answers from it while the plan is decided."""
    real = host.systemctl or next((res.setup.systemctl for res in resources if res.setup.systemctl is not None), None)
    if real is None:
        return []
    units = [instance_unit(res.setup.config.instance) for res in resources if res.setup.systemctl is not None]
    states = real.states(units + ([HEALTH_TIMER] if host.systemctl is not None else []))
    observed: t.List[ObservedSystemctl] = []

    def answering(systemctl: t.Any) -> ObservedSystemctl:
        # A run that waited for another observes again: its proxies answer from the new observation.
        proxy = systemctl if isinstance(systemctl, ObservedSystemctl) else ObservedSystemctl(systemctl, states, seen.unobserved)
        proxy.states, proxy.unobserved = states, seen.unobserved
        observed.append(proxy)
        return proxy
    for res in resources:
        if res.setup.systemctl is not None:
            res.setup.systemctl = answering(res.setup.systemctl)
    if host.around.systemctl is not None:
        host.around.systemctl = answering(host.around.systemctl)
    return observed
