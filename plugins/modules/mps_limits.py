#!/usr/bin/python
# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r'''
module: mps_limits
short_description: Set MPS thread and pinned-memory limits of a resource, and keep them across restarts
version_added: 0.1.0
description:
  - Sets the default active thread percentage and pinned device memory limit that an MPS control daemon gives every
    server it starts - explicitly, or computed from a replica count as NVIDIA's device plugin does.
  - MPS forgets these defaults on every restart. The module persists the wanted limits under O(config_dir); they are
    replayed right after every start of the daemon - by M(gpufleet.mps.mps_daemon) and by the systemd unit - so a
    crash, restart or reboot gets them back. The default thread percentage is also in the daemon's start environment
    (NVIDIA documents it as the default of every server), so it binds the first client; the pinned memory limits are
    set in the first control session after the daemon answers.
  - Reads everything it needs from the daemon in one control UI process, and applies only the differences in at
    most one more. The daemon reads memory limits back rounded down to whole GiB (V(3840M) reads V(3G)); the
    persisted record is the truth for what was set, the read-back detects drift.
  - Devices are addressed by the daemon's ordinals (its C(CUDA_VISIBLE_DEVICES) order), never by UUID - limits set
    by UUID are accepted but not applied by real drivers.
  - When the daemon is not running, the limits are persisted only (RV(applied=false), and RV(msg) says why); its next
    start applies them. Setting limits before the first start is the safe order - no server ever starts without them -
    and gives no warning, nor does a daemon stopped with M(gpufleet.mps.mps_daemon). A daemon that was started and is
    not running now - its C(.started) record or files of its pipe directory are still there, as after a crash - does.
  - Only the limits given are changed; the others keep their persisted values. M(gpufleet.mps.mps_host) (and so the
    fleet role) manages a resource's limits exactly instead - a limit not listed is removed (thread percentage back to
    100; a pinned memory limit dropped with a restart of the daemon, as MPS has no command to unset one).
extends_documentation_fragment:
  - gpufleet.mps._common
  - gpufleet.mps._common.root
  - gpufleet.mps._common.name
  - gpufleet.mps._common.running_servers
attributes:
  check_mode:
    description: Reads the daemon, reports the commands it would send and the record it would write, changes nothing.
    support: full
  diff_mode:
    description: Shows the limits as the daemon reports them before, and as wanted after.
    support: full
  idempotent:
    description: A second run with the same options changes nothing, despite the daemon's lossy memory read-back.
    support: full
options:
  active_thread_percentage:
    description:
      - Default active thread percentage for the daemon's servers, a number greater than 0 and at most 100 (V(25),
        V(12.5), or the same as a string, as a template renders it). Anything else is refused naming the parameter.
      - Overrides the value computed from O(replicas).
    type: raw
  pinned_device_mem_limit:
    description:
      - Default pinned device memory limit - one size for every GPU of the daemon, or a mapping from host GPU index or
        UUID (or, for a daemon on a MIG device, its address C(1:0) or C(MIG-) UUID) to a size.
      - A size is a whole or decimal number followed, without a space, by one of the units V(M), V(MiB), V(G) or
        V(GiB), in any case - for example V(20G), V(20GiB), V(20480M), V(20480MiB) or V(1.5G). M and MiB are 2^20
        bytes, G and GiB 2^30, as MPS itself reads them. A size must come to a whole number of MiB, at least 1
        (V(1.3G) does not); it is sent to the daemon in MiB (V(20G) as V(20480M)).
      - Refused, with a message that names the parameter and the forms above - a number without a unit; the decimal
        units V(GB) and V(MB) (V(20GB) is 20 x 10^9 bytes to some and 20 x 2^30 to others; the message gives both
        readings, the decimal one rounded down to whole MiB, for example V(19073M)); any other unit (V(T), V(K),
        V(Gi)).
      - A size larger than the memory of a GPU it applies to (C(memory_total_mib) in M(gpufleet.mps.mps_info)) is
        refused before anything is changed, naming the GPU (index and UUID) and its size; all of it is allowed.
        Before the first start of a new resource (O(create)) its GPUs are not known yet - one size for every GPU is
        then refused only when it is larger than every GPU of the host, and checked against the daemon's GPUs on
        every later run; the fleet role's pre-flight checks it against the resource's own GPUs.
      - Overrides the values computed from O(replicas).
    type: raw
  replicas:
    description:
      - Share each GPU between this many clients - thread percentage C(100 // replicas) and, per GPU, pinned memory
        C(total_MiB // replicas), as NVIDIA's device plugin computes them. Explicit O(active_thread_percentage) and
        O(pinned_device_mem_limit) override the computed values.
      - At most the GPU's MPS client limit - 16 before compute capability 7.0 (Volta), 48 from it on, 60 on drivers 590 and later.
        On a MIG device the memory is the instance's and the limit is the GPU's lowered in proportion to the compute
        instance's slices (a 1g device of an H100 takes 6).
        Before the first start of a new resource (its GPUs not known yet) it is refused only when no GPU of the host
        takes that many.
      - A whole number; given as text (V("4"), as C(-e) and templates give it) it is the number. M(gpufleet.mps.mps_host)'s
        resources also take a mapping from GPU model to a number here; this module takes one number.
    type: raw
  oversubscribe:
    description:
      - With O(replicas) and an explicit O(pinned_device_mem_limit), each of the replicas may pin that much. A limit that,
        times O(replicas), is more than a GPU's memory lets its clients together pin more than it holds, and the last
        ones to allocate fail. Such a plan is refused (check mode too), naming the GPU and the largest limit that fits,
        unless this is V(true).
      - Without O(replicas), or with the computed limit (C(total_MiB // replicas)), there is nothing to oversubscribe.
    type: bool
    default: false
    version_added: 0.2.0
  client_priority:
    description:
      - The default priority of the clients of the daemon's servers - V(normal) (MPS's own default) or V(below_normal)
        (V(0) and V(1) too, as C(CUDA_MPS_CLIENT_PRIORITY) takes them). A client may still lower its own priority with
        C(CUDA_MPS_CLIENT_PRIORITY=1).
      - Set with C(set_default_client_priority), persisted and replayed after every start like the other defaults. MPS has
        no command for a running server's priority - servers started before a change keep theirs (a warning says so).
      - Refused, before anything changes, where the control binary has no client priority (its running daemon does not
        answer C(get_default_client_priority), or the binary's help text does not list C(set_default_client_priority)).
        r580 has it.
    type: str
    version_added: 0.2.0
  sm_partitions:
    description:
      - Static SM partitions, in chunks, that each GPU of the daemon gets - for example V([8, 4, 4]). A chunk is a fixed
        group of SMs (8 on Hopper and newer, 4 before, as RV(sm_partitions) reports them). A client takes exactly the
        SMs of the partition it names in C(CUDA_MPS_SM_PARTITION) (M(gpufleet.mps.mps_info) lists each partition's
        value); on a daemon with partitions every client must name one.
      - Needs CUDA 13.1 or later (control binary 13010; r580 is 13000 and has none) and Ampere or newer GPUs. Refused,
        before anything changes, where the binary's help text does not list C(sm_partition), or a GPU is older.
      - A daemon with partitions runs in static partitioning mode (C(nvidia-cuda-mps-control -d -S)), which is fixed
        when it starts - M(gpufleet.mps.mps_daemon) starts and records it so. Partition IDs are the daemon's, new at
        every start - the partitions are created again after every start, like the other defaults.
      - On a running daemon with C(-S), partitions of a listed size are kept, others are created
        (C(sm_partition add)), and those no longer listed are removed (C(sm_partition rm)) - a partition with clients
        is not, and the run is refused before anything changes. On a running daemon without C(-S) the partitions
        are persisted and a warning says that the daemon's restart applies them (RV(restart_needed)).
      - V([]) removes them; not given, the persisted ones are kept. The value is inferred from NVIDIA's documentation
        and client code, not yet checked against a real CUDA 13.1 binary.
    type: list
    elements: int
    version_added: 0.2.0
  record:
    description:
      - Write the wanted limits into the resource's record (C(<config_dir>/<instance>.limits.json), the files every start
        replays rendered from it), so that every start of the daemon replays them. Without it they last until the next
        restart, and the lossy read-back can hide a small change (V(3840M) to V(3900M)).
      - Named C(persist) in 0.1.0; that name is deprecated (M(gpufleet.mps.mps_shm)'s O(gpufleet.mps.mps_shm#module:persist)
        means how a mount comes back at boot).
    type: bool
    default: true
    aliases: [persist]
    version_added: 0.2.0
  create:
    description:
      - Persist limits for a resource that has no daemon and no persisted limits yet, so that its first start already
        applies them. Without it such a resource name is refused, as a likely typo.
    type: bool
    default: false
  timeout:
    description:
      - Seconds to wait for the control daemon to answer.
    type: int
    default: 30
notes:
  - Limits that are not given are left as they are; MPS has no way to unset a default other than a restart without
    replay.
seealso:
  - module: gpufleet.mps.mps_daemon
author:
  - gpufleet.mps developers (@gpufleet)
'''

EXAMPLES = r'''
- name: Four clients per GPU, as the device plugin's replicas would
  gpufleet.mps.mps_limits:
    name: train
    replicas: 4

- name: Explicit limits, more memory on the GPU with this UUID prefix
  gpufleet.mps.mps_limits:
    name: train
    active_thread_percentage: 50
    pinned_device_mem_limit:
      0: 20G
      GPU-a55c2176: 30G

- name: New limits for clients of servers that already run, too
  gpufleet.mps.mps_limits:
    name: infer
    pinned_device_mem_limit: 8G
    running_servers: update

- name: Limits before the first start, then the daemon
  block:
    - name: Persist the limits of a new resource
      gpufleet.mps.mps_limits:
        name: batch
        replicas: 8
        create: true
    - name: Start its daemon, which applies them
      gpufleet.mps.mps_daemon:
        name: batch
        devices: [3]
'''

RETURN = r'''
limits:
  description: The wanted limits, normalised.
  returned: always
  type: dict
  sample:
    active_thread_percentage: 25.0
    replicas: 4
    pinned_device_mem_limit:
      by_ordinal: {'0': 3840M}
      by_uuid: {GPU-6a2b5c1e-5f0e-4e9b-9a55-1c7f2a1b0c01: 3840M}
    devices: [{ordinal: 0, index: 2, uuid: GPU-6a2b5c1e-5f0e-4e9b-9a55-1c7f2a1b0c01, name: Tesla T4}]
before:
  description: The defaults as the daemon reported them (as persisted, when it is not running), memory per ordinal.
  returned: always
  type: dict
  sample: {active_thread_percentage: 100.0, pinned_device_mem_limit: {'0': null}}
after:
  description: The defaults as wanted, memory per ordinal.
  returned: always
  type: dict
  sample: {active_thread_percentage: 25.0, pinned_device_mem_limit: {'0': 3840M}}
commands:
  description: The control commands sent (or, in check mode, that would be sent).
  returned: always
  type: list
  elements: str
  sample: [set_default_device_pinned_mem_limit 0 3840M, set_default_active_thread_percentage 25.0]
applied:
  description: Whether limits were (or in check mode would be) sent to a running daemon.
  returned: always
  type: bool
  sample: true
msg:
  description:
    - What was done with the daemon, and why the limits were not applied when they were not - the daemon is not running
      (not started yet, or stopped), or was started and is not running now (also a warning).
  returned: always
  type: str
  sample: "the MPS control daemon of 'train' is not running (not started yet, or stopped): the limits are persisted, not
    applied now; its next start applies them"
  version_added: 0.2.0
persisted:
  description: Whether the persisted record changed (or would).
  returned: always
  type: bool
  sample: true
running:
  description: Whether the resource's daemon is running.
  returned: always
  type: bool
  sample: true
pending:
  description: Servers still running with other limits than wanted (with O(running_servers=ignore)), with their own limits.
  returned: always
  type: list
  elements: dict
  sample: [{pid: 4242, active_thread_percentage: 100.0, pinned_device_mem_limit: {'0': null}}]
actions:
  description:
    - What the run did, or in check mode would do, in order - the control commands applied in one UI session and the
      files of O(config_dir) written. Empty when nothing changed.
  returned: always
  type: list
  elements: str
  sample: ['apply set_default_active_thread_percentage 25.0', 'write /etc/gpufleet-mps/train.limits.json']
  version_added: 0.2.0
sm_partitions:
  description:
    - The daemon's static SM partitions as C(lspart) listed them after the run's reading (IDs change at every start;
      a partition created by this run is listed on the next run) - C(id) is what a client sets as C(CUDA_MPS_SM_PARTITION).
    - Null when the daemon is not running or runs without static partitioning.
  returned: always
  type: list
  elements: dict
  sample: [{device: GPU-a8aa752d-52a7-47f6-ab1d-d3295872ad6b, id: GPU-a8aa752d-52a7-47f6-ab1d-d3295872ad6b/Dx4AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA,
            chunks: 8, sms: 64, in_use: false}]
  version_added: 0.2.0
restart_needed:
  description: Why the running daemon must restart for the wanted limits (static SM partitions need C(-S)); empty when it need not.
  returned: always
  type: str
  sample: "static SM partitions need a daemon started with -S, and train was started without it: the mode is fixed at the start"
  version_added: 0.2.0
'''

from ansible_collections.gpufleet.mps.plugins.module_utils._errors import InvalidParameterError, MpsError
from ansible_collections.gpufleet.mps.plugins.module_utils._gpus import ENUMERATION_WARNING, Nvml
from ansible_collections.gpufleet.mps.plugins.module_utils._limits.manager import LimitsManager
from ansible_collections.gpufleet.mps.plugins.module_utils._module import control_binary, finish, run_module
from ansible_collections.gpufleet.mps.plugins.module_utils._options import spec
from ansible_collections.gpufleet.mps.plugins.module_utils._resource.layout import config_paths, resource_paths
from ansible_collections.gpufleet.mps.plugins.module_utils._supervisor.process import Daemon


def argument_spec():
    return spec(
        'root', 'config_dir', 'control_binary', 'running_servers', 'active_thread_percentage', 'pinned_device_mem_limit',
        'replicas', 'oversubscribe', 'client_priority', 'sm_partitions',
        name=dict(type='str', required=True),
        record=dict(type='bool', default=True, aliases=['persist'],
                    deprecated_aliases=[dict(name='persist', version='1.0.0', collection_name='gpufleet.mps')]),
        create=dict(type='bool', default=False),
        timeout=dict(type='int', default=30),
    )


def run(module):
    params = module.params
    if params['timeout'] <= 0:
        raise InvalidParameterError('timeout', 'must be a positive number of seconds, got %d' % params['timeout'])
    paths = resource_paths(params['root'], params['name'])
    config = config_paths(params['config_dir'], params['name'])
    # The binary is needed only to talk to a running daemon (and to read its help): a missing one is said then.
    try:
        daemon = Daemon(paths, control_binary(params['control_binary']), start_timeout=params['timeout'], stop_timeout=0)
        missing = None
    except MpsError as exc:
        daemon, missing = None, exc
    with Nvml() as nvml:
        manager = LimitsManager(paths, config, daemon, nvml.gpus(), check_mode=module.check_mode, missing_binary=missing,
                                oversubscribe=params['oversubscribe'], client_priority=params['client_priority'],
                                sm_partitions=params['sm_partitions'])
        outcome = manager.ensure(params['active_thread_percentage'], params['pinned_device_mem_limit'], params['replicas'],
                                 params['running_servers'], persist_limits=params['record'], create=params['create'])
        if nvml.enumeration_var_was_set:
            outcome.warnings.append(ENUMERATION_WARNING)
    return finish(
        module, outcome,
        limits=outcome.limits,
        before=outcome.before,
        after=outcome.after,
        commands=outcome.commands,
        applied=outcome.applied,
        msg=outcome.msg,
        persisted=outcome.persisted,
        running=outcome.running,
        pending=outcome.pending,
        sm_partitions=outcome.sm_partitions,
        restart_needed=outcome.restart_needed,
    )


def main():
    run_module(argument_spec(), run)


if __name__ == '__main__':
    main()
