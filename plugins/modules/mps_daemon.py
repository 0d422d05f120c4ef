#!/usr/bin/python
# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: mps_daemon
short_description: Run one NVIDIA CUDA MPS control daemon per resource, idempotently
version_added: 0.1.0
description:
  - Starts, stops and restarts the MPS control daemon (C(nvidia-cuda-mps-control -d)) of one resource - a named
    group of GPUs - under a root directory laid out like NVIDIA's Kubernetes device plugin
    (C(<root>/<name>/pipe), C(<root>/<name>/log), C(<root>/<name>/.started)).
  - Each daemon sees only its own GPUs (C(CUDA_VISIBLE_DEVICES) by UUID); a GPU can belong to one daemon under a root.
  - A GPU that any other MPS control daemon on the host serves - under another O(root), started by hand, NVIDIA's
    device plugin's - is never taken (the start fails naming that daemon's pid and pipe directory), nor has its compute
    mode reset when this daemon stops. Daemons are found among the host's processes (C(nvidia-cuda-mps-control -d)
    or C(-f)) by their C(CUDA_MPS_PIPE_DIRECTORY) and C(CUDA_VISIBLE_DEVICES); reading another user's needs root.
  - A running daemon that answers and was started with the wanted devices, multi-user flag and supervisor is left
    alone at the cost of one control UI process and one NVML initialisation. Anything else is restarted, and the diff
    says what differed. A dead daemon's leftover files are cleaned up and the daemon started again, with a warning.
  - The limits persisted for the resource by M(gpufleet.mps.mps_limits) (in O(config_dir)) hold from the daemon's
    start. The default active thread percentage is in the daemon's start environment
    (C(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), which NVIDIA documents as the default of every server the daemon
    spawns), so it binds the very first client. The pinned device memory limits have no documented start form for
    the daemon - they are replayed in the first control session after the daemon answers (the same UI process as the
    health check, every reply checked); a client that connects within those milliseconds, and its server, get no
    memory limit. The same holds for a start by systemd (C(EnvironmentFile=), C(ExecStartPost=)).
  - A daemon that is alive but does not answer within O(start_timeout) is reported, with its pid and log file, and
    never killed.
extends_documentation_fragment:
  - gpufleet.mps._common
attributes:
  check_mode:
    description: Reports what would change without touching GPUs, files or processes.
    support: full
  diff_mode:
    description: Shows the daemon's state, devices, multi-user flag and supervisor before and after.
    support: full
  idempotent:
    description: A second run with the same options changes nothing.
    support: full
options:
  state:
    description:
      - V(started) starts the daemon when it is not running or was started differently (restarting it then).
      - V(stopped) stops it with C(quit -t) O(stop_timeout), sets the compute mode of its GPUs back to DEFAULT unless
        another daemon under O(root) uses them, and removes C(.started). Logs are kept.
      - V(restarted) always restarts it.
      - V(absent) stops it as V(stopped) does, disables its unit, then removes what this module and
        M(gpufleet.mps.mps_limits) created for the resource and nothing else - by name, never a whole directory -
        its systemd environment file and drop-ins, C(.started), the persisted limits, the files the daemon leaves in its
        pipe directory and the resource lock. A directory goes only when it is empty afterwards (the pipe and resource
        directories, O(root) and O(config_dir) included), so files of other tools stay, each directory kept for them
        named in a warning with what it holds. The template unit C(gpufleet-mps@.service) goes with the last resource
        of O(config_dir). The logs stay unless O(remove_logs).
    type: str
    choices: [started, stopped, restarted, absent]
    default: started
  busy:
    description:
      - What to do when the daemon must stop - a restart (a change of O(devices), O(multiuser), O(shm), O(supervisor), of
        the values its systemd environment file starts it with, or O(state=restarted)), O(state=stopped) or
        O(state=absent) - while clients are connected to its servers. The clients are read from the daemon
        (C(get_server_list), C(get_client_list)), in the same run, before anything is changed.
      - V(refuse) fails the task before anything is done, naming each client's pid, uid and server, and leaves the
        daemon and its clients alone. Check mode fails the same way, so a preview shows which jobs a change would end.
      - V(wait) waits up to O(busy_timeout) seconds for the clients to leave, then goes on; if they have not left, the
        task fails and nothing is stopped.
      - V(terminate) goes on at once; C(quit -t) O(stop_timeout) then ends the servers of the clients still connected,
        so their GPU work is gone while their processes live on (as a real r580 driver did on an H200). The clients
        are named in a warning and in RV(clients).
      - A daemon with no client is stopped or restarted at once, whatever this option says.
    type: str
    choices: [refuse, wait, terminate]
    default: refuse
    version_added: 0.2.0
  busy_timeout:
    description:
      - With O(busy=wait), how many seconds to wait for the connected clients to leave.
    type: int
    default: 600
    version_added: 0.2.0
  remove_logs:
    description:
      - With O(state=absent), also remove the daemon's C(control.log) and C(server.log), and the log directory when it
        is empty then.
    type: bool
    default: false
    version_added: 0.2.0
  devices:
    description:
      - The GPUs of this resource - V(all), or a list of GPU indices, UUIDs (C(GPU-...)) or unique UUID prefixes, as
        C(nvidia-smi -L) shows them. The order sets the daemon's device ordinals (0, 1, ...).
      - Or one MIG device - C(<gpu index>:<mig index>) (C(1:0) is C(MIG ... Device 0) under C(GPU 1) in C(nvidia-smi -L)),
        its UUID (C(MIG-...)) or the legacy C(MIG-GPU-<gpu uuid>/<gpu instance>/<compute instance>). The daemon gets
        C(CUDA_VISIBLE_DEVICES=MIG-<uuid>); its clients see the instance as device 0. A MIG device is its resource's only
        device - NVIDIA runs MPS on MIG as one daemon per MIG device, and CUDA before driver R570 enumerates one MIG
        device per process and no whole GPU beside it - so a second device next to it is refused.
      - A whole GPU with MIG enabled is refused, the message listing its MIG devices. V(all) is every GPU not in MIG
        mode; the GPUs in MIG mode it leaves out are named in a warning.
    type: raw
    default: all
  compute_mode:
    description:
      - Compute mode set on the resource's GPUs before the daemon starts. NVIDIA recommends V(exclusive_process) under
        MPS, so that only the MPS server holds the GPU. V(unchanged) leaves the mode alone, also on stop.
      - The compute mode resets to DEFAULT at reboot; a run finds and repairs that without restarting the daemon.
      - NVML has no compute mode for a MIG device (nor for a GPU in MIG mode). On a MIG device this option is not
        applied, which RV(notes) and the diff say - the task does not fail.
    type: str
    choices: [exclusive_process, default, unchanged]
    default: exclusive_process
  selinux_type:
    description:
      - Where SELinux is enabled, the SELinux type the pipe directory gets (only the type of its context changes), so
        that MPS clients in containers may connect on an enforcing host - NVIDIA's device plugin labels it the same.
        Sockets the daemon creates there inherit it. Repaired when it drifted (a C(restorecon)), without a restart.
        Under O(supervisor=systemd) the unit sets it too (C(chcon -t)) each time it creates the directory, at boot.
      - An empty string leaves SELinux labels alone. A host without SELinux is never touched.
    type: str
    default: container_file_t
    version_added: 0.2.0
  multiuser:
    description:
      - Start the daemon with C(-multiuser-server) - one server shared by clients of every user.
      - Refused, before anything is done, when a GPU of O(devices) has a compute capability below 7.0 (before Volta) -
        the driver starts C(-multiuser-server) there, but clients that are not root then fail to connect.
    type: bool
    default: false
  supervisor:
    description:
      - Who keeps the daemon running. V(systemd) runs it as C(gpufleet-mps@<instance>.service), which sets the compute
        mode before start, replays the persisted limits after every start, stops it with C(quit -t) and restarts it on
        failure. V(none) starts it directly (containers, CI, hosts without systemd).
      - V(auto) is V(systemd) when systemd is PID 1, else V(none).
    type: str
    choices: [auto, systemd, none]
    default: auto
  enabled:
    description:
      - With O(supervisor=systemd), whether the unit starts at boot. With O(state=stopped), V(false) disables the unit
        and V(true) leaves its boot setting alone.
    type: bool
    default: true
  shm:
    description:
      - Run the daemon - and so every MPS server it starts - with C(<root>/shm) as its C(/dev/shm), in a private mount
        namespace (with O(supervisor=systemd) through a per-instance drop-in with C(BindPaths=), else with
        C(unshare --mount)). An MPS client and its server share memory through C(/dev/shm), so container clients
        then mount C(<root>/shm) as their C(/dev/shm) (see RV(container)), as with NVIDIA's device plugin. Mount the
        tmpfs first with M(gpufleet.mps.mps_shm).
      - With V(false) the daemon uses the host's C(/dev/shm); a container client then needs the host's too (C(--ipc=host)
        or a bind mount of C(/dev/shm)).
      - Changing it restarts the daemon; so does finding C(<root>/shm) mounted anew (unmounted and mounted again, not
        resized) under a running daemon that uses it.
    type: bool
    default: false
    version_added: 0.2.0
  foreground:
    description:
      - With O(supervisor=systemd), run the control daemon in the foreground (C(nvidia-cuda-mps-control -f), C(Type=exec)
        through a per-instance drop-in) instead of detached (C(-d), C(Type=forking)). What it logs then goes to its
        stdout, which systemd sends to the journal (C(journalctl -u gpufleet-mps@<instance>)); systemd watches the
        daemon process itself, without a pid file. The limits are replayed once the daemon answers, as with C(-d).
      - Refused with O(supervisor=none) (a daemon the module starts itself must detach). Changing it restarts the daemon.
    type: bool
    default: false
    version_added: 0.2.0
  unit_before:
    description:
      - With O(supervisor=systemd), systemd units the daemon's unit is ordered before, for example C(slurmd.service),
        C(kubelet.service) or C(ecs.service). A per-instance drop-in (C(gpufleet-order.conf)) gets C(Before=) with them, so
        that when both start (at boot), they start once the daemon answers (C(Type=forking) returns then).
      - Ordering only - it pulls none of them in, does not stop them when the daemon fails, and a unit that is not installed
        is ignored. Whole names with their type; each once; not this collection's own units. Changing it rewrites the
        drop-in and reloads systemd, without a restart of the daemon.
      - Refused with O(supervisor=none), since nothing orders a daemon the module starts itself.
    type: list
    elements: str
    default: []
    version_added: 0.2.0
  unit_after:
    description:
      - With O(supervisor=systemd), systemd units the daemon's unit is ordered after (C(After=) in the same drop-in), for
        example a driver or storage unit it needs first. The unit already starts after C(nvidia-persistenced.service).
      - As with O(unit_before) - ordering only, whole names, refused with O(supervisor=none); a unit may not be in both.
    type: list
    elements: str
    default: []
    version_added: 0.2.0
  container_root:
    description:
      - The directory under which containers see the resources' pipe directories (the device plugin's C(ContainerRoot)),
        used only to compute RV(container).
    type: path
    default: /mps
    version_added: 0.2.0
  log_mode:
    description:
      - Mode of the log directory C(<root>/<name>/log). C(control.log) records every client's pid and user and every
        control command, so by default only root can read it.
      - An octal string with all owner bits and no write bit for group and others - V(0700), V(0750) (root and the
        directory's group) or V(0755) (every user, as NVIDIA's device plugin has it). An existing directory is
        changed in place, without a restart.
    type: raw
    default: '0700'
    version_added: 0.2.0
  start_timeout:
    description:
      - Seconds to wait for the daemon to start answering, and for any control UI answer.
    type: int
    default: 30
  stop_timeout:
    description:
      - Seconds passed to C(quit -t) - after them the daemon forcibly ends the servers and clients still running.
    type: int
    default: 30
notes:
  - Needs root to change compute modes and to write under the default directories.
  - Clients reach the daemon with the returned RV(env). A parent of the pipe directory that other users cannot
    traverse makes non-root clients fail; the module warns about it.
  - A resource whose persisted limits hold static SM partitions (M(gpufleet.mps.mps_limits) O(gpufleet.mps.mps_limits#module:sm_partitions))
    is started with C(-S), as its start record says; a running daemon started otherwise (or with C(-S) when the partitions
    are gone) is restarted, O(busy) deciding about its clients. A control binary without static partitioning (its help
    text lists no C(sm_partition); r580) is refused before anything is stopped or started.
seealso:
  - module: gpufleet.mps.mps_limits
author:
  - gpufleet.mps developers (@gpufleet)
'''

EXAMPLES = r'''
- name: One daemon for every GPU, in the device plugin's default layout
  gpufleet.mps.mps_daemon:
    name: nvidia.com/gpu

- name: Stop it, and give its GPUs back to non-MPS users
  gpufleet.mps.mps_daemon:
    name: nvidia.com/gpu
    state: stopped

- name: Two daemons on disjoint GPUs, without systemd
  gpufleet.mps.mps_daemon:
    name: "{{ item.name }}"
    devices: "{{ item.devices }}"
    supervisor: none
  loop:
    - {name: train, devices: [0, 1]}
    - {name: infer, devices: [2]}

- name: A daemon whose server is shared by every user, on the GPU with this UUID prefix
  gpufleet.mps.mps_daemon:
    name: shared
    devices: [GPU-d77bfc07]
    multiuser: true
  register: shared

- name: What a client of that daemon needs in its environment
  ansible.builtin.debug:
    var: shared.env

- name: Stop it
  gpufleet.mps.mps_daemon:
    name: shared
    state: stopped

- name: Remove the resource and everything created for it - unit files, record, persisted limits - but its logs
  gpufleet.mps.mps_daemon:
    name: shared
    state: absent
'''

RETURN = r'''
pid:
  description: Pid of the running control daemon; null when stopped (or in check mode before a start).
  returned: always
  type: int
  sample: 4182
pipe_dir:
  description: The daemon's pipe directory (C(CUDA_MPS_PIPE_DIRECTORY)).
  returned: always
  type: str
  sample: /run/nvidia/mps/nvidia.com/gpu/pipe
log_dir:
  description: The daemon's log directory (C(control.log), C(server.log)).
  returned: always
  type: str
  sample: /run/nvidia/mps/nvidia.com/gpu/log
devices:
  description:
    - The resource's GPUs in the daemon's ordinal order; empty when stopped.
    - A MIG device also has C(mig) (its address, C(1:0)) and C(profile); its C(index) is its GPU's.
  returned: always
  type: list
  elements: dict
  sample: [{index: 0, uuid: GPU-6a2b5c1e-5f0e-4e9b-9a55-1c7f2a1b0c01, name: NVIDIA H100 80GB HBM3}]
env:
  description: The environment a CUDA client needs to use this daemon.
  returned: always
  type: dict
  sample: {CUDA_MPS_PIPE_DIRECTORY: /run/nvidia/mps/nvidia.com/gpu/pipe, CUDA_MPS_LOG_DIRECTORY: /run/nvidia/mps/nvidia.com/gpu/log}
supervisor:
  description: The supervisor in effect (V(auto) resolved).
  returned: always
  type: str
  sample: systemd
started_at:
  description: When the running daemon was started by this collection (UTC, ISO 8601); null when stopped.
  returned: always
  type: str
  sample: '2026-12-02T13:04:59Z'
forced:
  description: Whether stopping the daemon had to force out servers or clients after O(stop_timeout).
  returned: always
  type: bool
  sample: false
clients:
  description:
    - The clients that were connected when the daemon had to stop (see O(busy)) - ended with O(busy=terminate), waited
      for with O(busy=wait) - each with its C(pid), C(uid) (null when unknown) and the C(server) it was on. Empty when the
      daemon was not stopped or had no client.
  returned: always
  type: list
  elements: dict
  sample: [{pid: 4312, uid: 1000, server: 4288}]
  version_added: 0.2.0
selinux:
  description:
    - Where SELinux is enabled and O(selinux_type) is set, the pipe directory's SELinux type before the run
      (null when the directory did not exist) and after it; null otherwise (no SELinux, or labels left alone).
  returned: always
  type: dict
  sample: {before: var_run_t, after: container_file_t}
  version_added: 0.2.0
container:
  description:
    - What a client in a container needs, in the device plugin's layout - bind mounts from host paths to container
      paths, and the environment as the container sees it. Template C(docker run -v), a Podman quadlet or a pod spec
      from it.
  returned: always
  type: dict
  contains:
    root:
      description: The container root (O(container_root)).
      type: str
      sample: /mps
    pipe_dir:
      description: The pipe directory inside the container.
      type: str
      sample: /mps/nvidia.com/gpu/pipe
    env:
      description: The environment a client in the container sets.
      type: dict
      sample: {CUDA_MPS_PIPE_DIRECTORY: /mps/nvidia.com/gpu/pipe}
    mounts:
      description:
        - Bind mounts, C(source) on the host to C(target) in the container - the pipe directory, and the daemon's
          C(/dev/shm) (C(<root>/shm) with O(shm=true), else the host's C(/dev/shm)) at C(/dev/shm).
      type: list
      elements: dict
      sample: [{source: /run/nvidia/mps/nvidia.com/gpu/pipe, target: /mps/nvidia.com/gpu/pipe}, {source: /run/nvidia/mps/shm, target: /dev/shm}]
    engine:
      description:
        - The same as a container engine's arguments - C(podman) and C(docker) (C(--volume) the pipe directory
          read-only and the daemon's C(/dev/shm) read-write, C(--env) each variable) - and C(kubernetes), the
          C(volumes) (C(hostPath)), C(volumeMounts) and C(env) of a pod spec. See the containers guide.
      type: dict
      sample: {podman: [--volume, '/run/nvidia/mps/nvidia.com/gpu/pipe:/mps/nvidia.com/gpu/pipe:ro', --volume, '/run/nvidia/mps/shm:/dev/shm',
                        --env, CUDA_MPS_PIPE_DIRECTORY=/mps/nvidia.com/gpu/pipe]}
      version_added: 0.2.0
notes:
  description: What the run did not do as asked, and why, without failing - a compute mode on a MIG device.
  returned: always
  type: list
  elements: str
  sample: ['compute mode EXCLUSIVE_PROCESS not applied: MIG device 1:0 (3g.40gb, MIG-67ea...) is a MIG device, ...']
  version_added: 0.2.0
gone:
  description:
    - The devices the daemon was started on that NVML no longer reports, each with its C(uuid) and a C(message) saying
      what to do - typically a MIG instance destroyed, or re-created with a new UUID by re-partitioning. Also warned.
  returned: always
  type: list
  elements: dict
  sample: [{uuid: MIG-4502df36-d355-dd53-45ab-861586d827ec, message: 'MIG device MIG-4502... no longer exists: ...'}]
  version_added: 0.2.0
actions:
  description: What was done (or, in check mode, would be done), in order.
  returned: always
  type: list
  elements: str
  sample: ['set compute mode EXCLUSIVE_PROCESS on GPU 0 (GPU-6a2b5c1e-5f0e-4e9b-9a55-1c7f2a1b0c01)', 'start the MPS control daemon']
'''

from ansible_collections.gpufleet.mps.plugins.module_utils._daemon.manager import DaemonSetup
from ansible_collections.gpufleet.mps.plugins.module_utils._gpus import ENUMERATION_WARNING, Nvml
from ansible_collections.gpufleet.mps.plugins.module_utils._module import control_binary, finish, run_module
from ansible_collections.gpufleet.mps.plugins.module_utils._options import spec


def argument_spec():
    return spec(
        'root', 'config_dir', 'control_binary', 'remove_logs', 'busy', 'busy_timeout', 'devices', 'compute_mode', 'multiuser',
        'supervisor', 'start_timeout', 'stop_timeout', 'log_mode', 'shm', 'foreground', 'container_root', 'selinux_type',
        'unit_before', 'unit_after',
        name=dict(type='str', required=True),
        state=dict(type='str', choices=['started', 'stopped', 'restarted', 'absent'], default='started'),
        enabled=dict(type='bool', default=True),
    )


def run(module):
    params = module.params
    setup = DaemonSetup.from_params(params, control_binary)
    with Nvml() as nvml:
        outcome = setup.manager(nvml, module.check_mode).ensure(
            params['state'], params['devices'], params['multiuser'], params['compute_mode'], params['enabled'], params['shm'],
            remove_logs=params['remove_logs'], foreground=params['foreground'])
        if nvml.enumeration_var_was_set:
            outcome.warnings.append(ENUMERATION_WARNING)
    running = params['state'] not in ('stopped', 'absent')
    return finish(
        module, outcome,
        pid=outcome.pid if running else None,
        pipe_dir=setup.paths.pipe_dir,
        log_dir=setup.paths.log_dir,
        devices=outcome.devices if running else [],
        env=setup.paths.client_env(),
        container=setup.container,
        supervisor=setup.supervisor,
        started_at=outcome.started_at if running else None,
        forced=outcome.forced,
        clients=outcome.clients,
        selinux=outcome.selinux,
        notes=outcome.notes,
        gone=outcome.gone,
    )


def main():
    run_module(argument_spec(), run)


if __name__ == '__main__':
    main()
