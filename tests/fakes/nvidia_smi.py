# Copyright: gpufleet.mps contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A minimal ``nvidia-smi`` over NVML, for the simulated host: ``-L`` and ``-i IDS -c MODE``.

The systemd unit sets compute modes with ``nvidia-smi -i <uuids> -c <mode>``, and the benchmark's
hand-written baseline does too; on the simulated host this stand-in does it through the real
nvidia-ml-py and the fake libnvidia-ml.so.1, so the change is seen by every later NVML user.
"""

from __future__ import annotations

import argparse
import sys

import pynvml

MODES = {'DEFAULT': 0, '0': 0, 'PROHIBITED': 2, '2': 2, 'EXCLUSIVE_PROCESS': 3, '3': 3}
# How nvidia-smi --query-gpu prints compute_mode.
QUERY_MODE_NAMES = {0: 'Default', 1: 'Exclusive_Thread', 2: 'Prohibited', 3: 'Exclusive_Process'}
QUERY_FIELDS = {
    'index': lambda h: str(pynvml.nvmlDeviceGetIndex(h)),
    'uuid': lambda h: _text(pynvml.nvmlDeviceGetUUID(h)),
    'name': lambda h: _text(pynvml.nvmlDeviceGetName(h)),
    'compute_mode': lambda h: QUERY_MODE_NAMES[pynvml.nvmlDeviceGetComputeMode(h)],
    'memory.total': lambda h: '%d MiB' % (pynvml.nvmlDeviceGetMemoryInfo(h).total // 1048576),
}


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _select(ids: str) -> list:
    handles = []
    for ident in ids.split(','):
        ident = ident.strip()
        if ident.isdigit():
            handles.append(pynvml.nvmlDeviceGetHandleByIndex(int(ident)))
        else:
            handles.append(pynvml.nvmlDeviceGetHandleByUUID(ident))
    return handles


def _list_migs(handle) -> None:
    """The MIG devices under a GPU in MIG mode, as the real ``nvidia-smi -L`` indents them (MIG user guide)."""
    try:
        slots = pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)
    except pynvml.NVMLError:
        return
    for mig_index in range(slots):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig_index)
        except pynvml.NVMLError:
            continue
        profile = _text(pynvml.nvmlDeviceGetName(mig)).split(' MIG ', 1)[-1]
        print('  MIG %-12s Device %2d: (UUID: %s)' % (profile, mig_index, _text(pynvml.nvmlDeviceGetUUID(mig))))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog='nvidia-smi', add_help=True)
    parser.add_argument('-L', '--list-gpus', action='store_true')
    parser.add_argument('-i', '--id')
    parser.add_argument('-c', '--compute-mode')
    parser.add_argument('--query-gpu')
    parser.add_argument('--format')
    args = parser.parse_args(argv)
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        print('NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver. (%s)' % exc)
        return 9
    try:
        if args.list_gpus:
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                print('GPU %d: %s (UUID: %s)' % (index, _text(pynvml.nvmlDeviceGetName(handle)), _text(pynvml.nvmlDeviceGetUUID(handle))))
                _list_migs(handle)
            return 0
        if args.query_gpu:
            if args.format != 'csv,noheader':
                print('Only --format=csv,noheader is simulated')
                return 2
            fields = args.query_gpu.split(',')
            unknown = [field for field in fields if field not in QUERY_FIELDS]
            if unknown:
                print('Field "%s" is not a valid field to query.' % unknown[0])
                return 2
            handles = _select(args.id) if args.id else [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            for handle in handles:
                print(', '.join(QUERY_FIELDS[field](handle) for field in fields))
            return 0
        if args.compute_mode is not None:
            mode = MODES.get(args.compute_mode.upper())
            if mode is None:
                print('Invalid compute mode: %s' % args.compute_mode)
                return 2
            handles = _select(args.id) if args.id else [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            for handle in handles:
                pynvml.nvmlDeviceSetComputeMode(handle, mode)
                name = [key for key, value in MODES.items() if value == mode and not key.isdigit()][0]
                print('Set compute mode to %s for GPU %s.' % (name, _text(pynvml.nvmlDeviceGetUUID(handle))))
            print('All done.')
            return 0
        parser.print_usage()
        return 2
    except pynvml.NVMLError as exc:
        print('Unable to complete the request: %s' % exc)
        return 4
    finally:
        pynvml.nvmlShutdown()


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
