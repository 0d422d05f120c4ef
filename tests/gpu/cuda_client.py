# Copyright: (c) gpufleet.mps contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A real CUDA client for compare_mps.py: the driver API through ctypes, no toolkit needed.

``cuInit`` connects to the MPS control daemon named by CUDA_MPS_PIPE_DIRECTORY (the
daemon starts or picks the server); retaining the primary context makes the server
create the client's context.  Prints ONE JSON line (``{"ok": true, "client_pid": ...}``
or ``{"ok": false, "error": "CUDA_ERROR_..."}``), then holds the context until stdin
closes or SIGTERM/SIGINT arrives, releases it and exits 0.  Same contract as the
simulator's mps_client.py, with its ``--device N`` and ``--uid N`` (drop to that user and
group before connecting).  ``--alloc 2048,3000`` allocates and frees each size (MiB), adds
``alloc_rc_by_mib`` (CUresult per size) and ``mem_free_mib`` to the line and exits at once.
"""
from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import sys


def error_name(lib: ctypes.CDLL, code: int) -> str:
    """CUresult as its name."""
    name = ctypes.c_char_p()
    if lib.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value:
        return name.value.decode()
    return f'CUresult {code}'


def main(argv: list[str]) -> int:
    """Connect (cuInit + primary context), report, hold, release."""
    ordinal = int(argv[argv.index('--device') + 1]) if '--device' in argv else 0
    if '--uid' in argv:  # as the simulator's client: drop to that user (and group) before cuInit connects
        uid = int(argv[argv.index('--uid') + 1])
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    try:
        lib = ctypes.CDLL('libcuda.so.1')
    except OSError as exc:
        print(json.dumps({'ok': False, 'error': 'LIBCUDA_NOT_FOUND', 'message': str(exc)}), flush=True)
        return 1
    device = ctypes.c_int()
    context = ctypes.c_void_p()
    for call, args in (('cuInit', (0,)), ('cuDeviceGet', (ctypes.byref(device), ordinal)),
                       ('cuDevicePrimaryCtxRetain', (ctypes.byref(context), device)), ('cuCtxSetCurrent', (context,))):
        code = getattr(lib, call)(*args)
        if code != 0:
            print(json.dumps({'ok': False, 'error': error_name(lib, code), 'call': call}), flush=True)
            return 1
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    info = {'ok': True, 'client_pid': os.getpid(), 'device': ordinal}
    if '--alloc' in argv:  # allocate (and free) each size in MiB: under a pinned limit the larger ones fail
        pointer = ctypes.c_uint64()
        info['alloc_rc_by_mib'] = {}
        for mib in argv[argv.index('--alloc') + 1].split(','):
            code = lib.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(int(mib) << 20))
            info['alloc_rc_by_mib'][mib] = code
            if code == 0:
                lib.cuMemFree_v2(pointer)
    if lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0:
        info['mem_total_mib'] = total.value // (1024 * 1024)
        info['mem_free_mib'] = free.value // (1024 * 1024)
    print(json.dumps(info, sort_keys=True), flush=True)
    if '--alloc' in argv:
        return 0

    stop_r, stop_w = os.pipe()
    signal.signal(signal.SIGTERM, lambda _s, _f: os.write(stop_w, b'x'))
    signal.signal(signal.SIGINT, lambda _s, _f: os.write(stop_w, b'x'))
    while True:
        ready = select.select([sys.stdin.fileno(), stop_r], [], [])[0]
        if stop_r in ready or not os.read(sys.stdin.fileno(), 65536):
            break
    release = getattr(lib, 'cuDevicePrimaryCtxRelease_v2', None) or lib.cuDevicePrimaryCtxRelease
    release(device)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
