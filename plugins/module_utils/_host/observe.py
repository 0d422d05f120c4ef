# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The observe stage of a host plan: the host read once, under the host lock, into the view every decision reads.

Every resource under the root and in the config directory (listed, to be removed, or neither), the /proc scan with the
root's orphans, the files and directories the plan compares, the mount table where something may be unmounted or
removed, every unit's state from one ``systemctl show``, one control batch per running daemon (its limits, servers and
their clients), an orphan's servers, what the control binary offers where a wanted limit needs it.
"""

from __future__ import annotations

import typing as t

from .._observe.paths import read_paths
from .._observe.reader import V3_HELP_WORD, Wants, read_daemon, read_help, read_host, read_orphan_servers, read_units
from .._observe.view import HostView
from .._proc import read_mountinfo
from .._supervisor.unit import instance_unit
from .around import HEALTH_TIMER


def observe(host: t.Any, listed: t.List[t.Any]) -> t.Tuple[HostView, t.List[t.Any]]:
    """``host`` (a HostManager) and its listed resources observed: (the sealed view, the resources to remove)."""
    p = host.params
    absent = p['state'] == 'absent'
    shm = host.shm
    wants = host.around.wants()
    if shm is not None:
        wants.merge(shm.wants())
    managers = {res.name: res.setup.manager(host.nvml, check_mode=host.check_mode) for res in listed}
    for res in listed:
        wants.merge(managers[res.name].wants(shm=p['shm']))
    view = read_host(host.root, host.nvml.gpus(), [(res.setup.paths, res.setup.config) for res in listed], wants,
                     with_logs=absent and p['remove_logs'], config_dir=host.config_dir)
    removed = host.removed_setups(view, listed)
    if removed:
        # What a removal looks at beyond the resource's own paths: its unit files, and which directories are mount points.
        more = Wants()
        for res in removed:
            managers[res.name] = res.setup.manager(host.nvml, check_mode=host.check_mode)
            more.merge(managers[res.name].wants(shm=False)).add(others=managers[res.name].removal_paths())
        if view.mountinfo is None:
            view.mountinfo = read_mountinfo()
            view.paths = view.paths.with_mounts(view.mountinfo)
        view.paths = view.paths.merged(read_paths(more.files - set(view.paths.paths()), more.dirs - set(view.paths.paths()),
                                                  more.others - set(view.paths.paths()), mountinfo=view.mountinfo))
    _observe_units(host, listed + removed, managers, view)
    for res in listed:
        # The one control batch of each running daemon (defaults, servers, their limits and clients); a v3 resource's
        # server lists are read below.
        if res.entry.v3 is None:
            host.limits_manager(res, view=view).probe(view)
        else:
            read_help(view, res.setup.daemon, V3_HELP_WORD)
        managers[res.name].probe(view, 'started', shm=p['shm'], ordinals=None)
    for name, seen in sorted(view.resources.items()):
        # A daemon the plan stops or removes, listed or not: its servers' clients, which busy decides about.
        if seen.liveness.running and seen.liveness.pid and name not in view.readouts and name not in view.v3:
            manager = managers.get(name)
            if manager is not None:
                readout = read_daemon(view, name, manager.daemon.query, 0, seen.liveness.pid, client=manager.daemon.client,
                                      config=manager.run.config, server=manager.daemon.v3_server)
                # a v3 daemon answered the health question where it lists its server Ready
                manager.daemon.answered = getattr(readout, 'ready', None) is not False
    for res in removed:
        managers[res.name].probe(view, 'absent', shm=False, ordinals=None)
    read_orphan_servers(view)
    if shm is not None:
        shm.probe(view)
    return view.seal(), removed


def shm_manager(params: t.Mapping[str, t.Any], root: str, unit_dir: str, *, check_mode: bool) -> t.Optional[t.Any]:
    """The shared tmpfs's manager, for a host with shm and for a teardown; None for neither."""
    absent = params['state'] == 'absent'
    if not (params['shm'] or absent):
        return None
    # Imported here: only hosts with shm, and teardowns, need it.
    from .._shm import ShmManager  # pylint: disable=import-outside-toplevel
    # The plan stops every daemon of the root before the unmount (daemons_stop_first).
    return ShmManager.for_host(root, 'absent' if absent else 'mounted', params['shm_persist'], '/etc/fstab', unit_dir,
                               check_mode=check_mode, selinux_type=params['selinux_type'], param='shm_persist', daemons_stop_first=absent)


def _observe_units(host: t.Any, resources: t.List[t.Any], managers: t.Mapping[str, t.Any], view: HostView) -> None:
    """Where systemd runs: every resource's unit, the health timer and the tmpfs's mount unit, in ONE systemctl process."""
    real = host.systemctl or next((res.setup.systemctl for res in resources if res.setup.systemctl is not None), None)
    if real is None:
        return
    units = [instance_unit(res.setup.config.instance) for res in resources if res.setup.systemctl is not None]
    if host.systemctl is not None:
        units.append(HEALTH_TIMER)
    if host.shm is not None and host.shm.systemctl is not None:
        units.append(host.shm.unit)
    read_units(view, real, units)
    del managers  # each manager's probe finds its unit's state read already
